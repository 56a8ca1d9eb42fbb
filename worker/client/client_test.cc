#include "worker/client/client.h"

#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::worker::client {
namespace {

using ::testing::HasSubstr;

// A store whose completions and blocking waits the test releases: two
// segments of two elements each.
class FakeStore final : public ParameterStore {
 public:
  struct Shared {
    absl::Mutex mu;
    std::vector<Done> pending ABSL_GUARDED_BY(mu);             // pushes' and pulls' completions
    std::vector<int64_t> steps_per_epoch ABSL_GUARDED_BY(mu);  // one per store made
    absl::Notification wait_entered;
    absl::Notification wait_released;
    absl::Status register_status;
  };
  explicit FakeStore(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}

  absl::StatusOr<Registration> Register(const std::vector<ParamSpec>& signature,
                                        absl::Span<const float> proposed) override {
    if (!shared_->register_status.ok()) return shared_->register_status;
    registered_ = true;
    Registration r;
    r.num_workers = 2;
    r.version = 3;
    return r;
  }
  absl::Status Push(int64_t, int64_t, absl::Span<const float>) override { return absl::OkStatus(); }
  absl::Status WaitForVersion(int64_t) override {
    shared_->wait_entered.Notify();
    shared_->wait_released.WaitForNotification();
    return absl::OkStatus();
  }
  absl::StatusOr<int64_t> Pull(int64_t version, absl::Span<float>) override { return version; }
  std::vector<int64_t> SegmentEnds() const override {
    return registered_ ? std::vector<int64_t>{2, 4} : std::vector<int64_t>{};
  }
  void PushSegments(int64_t, int64_t, int, int, absl::Span<const float>, Done done) override {
    absl::MutexLock lock(&shared_->mu);
    shared_->pending.push_back(std::move(done));
  }
  void PullSegments(int64_t, int, int, absl::Span<float>, Done done) override {
    absl::MutexLock lock(&shared_->mu);
    shared_->pending.push_back(std::move(done));
  }
  float LossScale() const override { return 0.5f; }

 private:
  std::shared_ptr<Shared> shared_;
  bool registered_ = false;
};

std::vector<ParamSpec> Signature() { return {{"w", {2}, DType::kF32}, {"b", {2}, DType::kF32}}; }

struct Fixture {
  std::shared_ptr<FakeStore::Shared> shared = std::make_shared<FakeStore::Shared>();
  std::unique_ptr<Client> client;

  Fixture() {
    auto made = Client::Create(
        [shared =
             shared](int64_t steps_per_epoch) -> absl::StatusOr<std::unique_ptr<ParameterStore>> {
          absl::MutexLock lock(&shared->mu);
          shared->steps_per_epoch.push_back(steps_per_epoch);
          return std::unique_ptr<ParameterStore>(std::make_unique<FakeStore>(shared));
        });
    EXPECT_TRUE(made.ok()) << made.status();
    client = std::move(made).value();
  }
  // Runs every completion held so far with `status`.
  void Complete(absl::Status status = absl::OkStatus()) {
    std::vector<ParameterStore::Done> pending;
    {
      absl::MutexLock lock(&shared->mu);
      pending.swap(shared->pending);
    }
    for (auto& done : pending) done(status);
  }
};

TEST(ClientTest, RegisterMakesTheStoreWithTheStepsPerEpochAfterAProbe) {
  Fixture f;
  std::vector<float> buffer(4);
  auto registration = f.client->Register(Signature(), buffer, 17);
  ASSERT_TRUE(registration.ok()) << registration.status();
  EXPECT_EQ(registration->version, 3);
  absl::MutexLock lock(&f.shared->mu);
  EXPECT_THAT(f.shared->steps_per_epoch, ::testing::ElementsAre(0, 17));
}

TEST(ClientTest, AFailedRegisterLeavesTheClientUnregistered) {
  Fixture f;
  f.shared->register_status = absl::FailedPreconditionError("the server refuses");
  EXPECT_EQ(f.client->Register(Signature(), {}, 0).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(f.client->SegmentEnds().status().message()),
              HasSubstr("before register"));
  f.shared->register_status = absl::OkStatus();
  EXPECT_TRUE(f.client->Register(Signature(), {}, 0).ok());
}

TEST(ClientTest, ABlockingCallRefusesPushesPullsAndOtherBlockingCalls) {
  Fixture f;
  ASSERT_TRUE(f.client->Register(Signature(), {}, 0).ok());
  std::vector<float> buffer(4);
  absl::Status waited;
  std::thread waiter([&] { waited = f.client->WaitForVersion(4); });
  f.shared->wait_entered.WaitForNotification();

  const absl::Status push = f.client->Push(3, 1, 0, 1, buffer).status();
  EXPECT_EQ(push.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(push.message()),
              HasSubstr("push while wait_for_version runs on another thread"));
  const absl::Status pull_all = f.client->PullAll(3, absl::MakeSpan(buffer)).status();
  EXPECT_EQ(pull_all.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(pull_all.message()), HasSubstr("one blocking call at a time"));
  EXPECT_EQ(f.client->Members(3).status().code(), absl::StatusCode::kFailedPrecondition);
  // What never waits still answers.
  EXPECT_EQ(*f.client->LossScale(), 0.5f);
  EXPECT_EQ(f.client->registration()->version, 3);

  f.shared->wait_released.Notify();
  waiter.join();
  EXPECT_TRUE(waited.ok()) << waited;
  EXPECT_TRUE(f.client->Push(3, 1, 0, 1, buffer).ok());
  f.Complete();
}

TEST(ClientTest, ExclusiveCallsWaitForNoOperationButMembersOverlapsThem) {
  Fixture f;
  ASSERT_TRUE(f.client->Register(Signature(), {}, 0).ok());
  std::vector<float> gradient(4), params(4);
  auto push = f.client->Push(3, 1, 0, 2, gradient);
  auto pull = f.client->Pull(4, 1, 2, absl::MakeSpan(params));
  ASSERT_TRUE(push.ok() && pull.ok());
  EXPECT_FALSE((*push)->done());
  EXPECT_EQ((*push)->status().code(), absl::StatusCode::kInternal);
  const absl::Status wait = f.client->WaitForVersion(4);
  EXPECT_EQ(wait.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(wait.message()), HasSubstr("2 pushes and pulls are in flight"));
  EXPECT_EQ(f.client->Reconnect({}).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(f.client->Members(4).ok());

  f.Complete(absl::UnavailableError("gone"));
  ASSERT_TRUE((*push)->WaitFor(absl::ZeroDuration()));
  EXPECT_EQ((*push)->status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ((*pull)->status().code(), absl::StatusCode::kUnavailable);
  // Every handle done: nothing is counted in flight any more.
  f.shared->wait_released.Notify();
  EXPECT_TRUE(f.client->WaitForVersion(4).ok());
}

TEST(ClientTest, TheDestructorWaitsForOperationsInFlight) {
  Fixture f;
  ASSERT_TRUE(f.client->Register(Signature(), {}, 0).ok());
  std::vector<float> gradient(4);
  auto push = f.client->Push(3, 1, 0, 2, gradient);
  ASSERT_TRUE(push.ok());
  absl::Notification destroyed;
  std::thread closer([&] {
    f.client.reset();
    destroyed.Notify();
  });
  EXPECT_FALSE(destroyed.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  f.Complete();
  closer.join();
  EXPECT_TRUE((*push)->done());
  EXPECT_TRUE((*push)->status().ok());
}

TEST(ClientTest, RegisterChecksTheSignatureAndInitialValues) {
  Fixture f;
  EXPECT_THAT(std::string(f.client->Register({}, {}, 0).status().message()),
              HasSubstr("no tensors"));
  std::vector<ParamSpec> unnamed = Signature();
  unnamed[1].name = "";
  EXPECT_THAT(std::string(f.client->Register(unnamed, {}, 0).status().message()),
              HasSubstr("tensor 1 has no name"));
  std::vector<ParamSpec> huge = {{"w", {1LL << 40, 1LL << 40}, DType::kF32}};
  EXPECT_THAT(std::string(f.client->Register(huge, {}, 0).status().message()),
              HasSubstr("overflows 64 bits"));
  std::vector<ParamSpec> ints = Signature();
  ints[0].dtype = DType::kI64;
  EXPECT_THAT(std::string(f.client->Register(ints, {}, 0).status().message()),
              HasSubstr("tensor 0 ('w') has dtype I64; the parameter server takes F32 only"));
  std::vector<float> five(5);
  EXPECT_THAT(std::string(f.client->Register(Signature(), five, 0).status().message()),
              HasSubstr("the initial values hold 5 elements; the model has 4"));
  EXPECT_EQ(Client::Create({}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Client::Create([](int64_t) -> absl::StatusOr<std::unique_ptr<ParameterStore>> {
              return absl::NotFoundError("no ca.pem");
            })
                .status()
                .code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace ps::worker::client
