#include "server/parameter_server.h"

#include <cmath>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::server {
namespace {

using ::testing::HasSubstr;

std::vector<ParamSpec> Signature() {
  return {{"fc.weight", {2, 3}, DType::kF32}, {"fc.bias", {2}, DType::kF32}};
}

std::vector<float> Initial() { return {1, 2, 3, 4, 5, 6, 0.5f, -0.5f}; }

class ParameterServerTest : public ::testing::Test {
 protected:
  std::unique_ptr<ParameterServer> MakeServer(int workers, int64_t chunk_elements = 4) {
    ParameterServerOptions options;
    options.num_workers = workers;
    options.chunk_elements = chunk_elements;
    options.optimizer.sgd.lr = 1.f;
    auto server = ParameterServer::Create(options, Signature(), Initial(), &device_);
    EXPECT_TRUE(server.ok()) << server.status();
    return std::move(server).value();
  }

  std::vector<float> Params(ParameterServer& server) {
    std::vector<float> out(8);
    auto v = server.Pull(0, absl::InfiniteFuture(), absl::MakeSpan(out));
    EXPECT_TRUE(v.ok()) << v.status();
    return out;
  }

  CpuDevice device_{0, 1};
};

// Pushes a whole gradient of value `g` for worker `rank`.
void PushAll(ParameterServer& server, int rank, int64_t iteration, float g, int64_t samples) {
  for (int key = 0; key < 2; ++key) {
    const int64_t n = key == 0 ? 6 : 2;
    for (int64_t c = 0; c < server.NumChunks(key); ++c) {
      const int64_t len = std::min<int64_t>(4, n - c * 4);
      std::vector<float> grad(len, g);
      ASSERT_TRUE(server.Push(rank, iteration, key, c, samples, grad).ok());
    }
  }
}

TEST_F(ParameterServerTest, SumsWorkersAndScalesByGlobalBatch) {
  auto server = MakeServer(2);
  ASSERT_TRUE(server->Register("a", Signature(), {}).ok());
  ASSERT_TRUE(server->Register("b", Signature(), {}).ok());
  EXPECT_EQ(server->NumChunks(0), 2);  // 6 elements in chunks of 4
  PushAll(*server, 0, 0, 3.f, 2);
  EXPECT_EQ(server->version(), 0);  // waits for worker 1
  PushAll(*server, 1, 0, 5.f, 6);
  EXPECT_EQ(server->version(), 1);
  // lr 1, gradient sum 8 over 8 samples: every parameter drops by 1.
  std::vector<float> expected = Initial();
  for (float& x : expected) x -= 1.f;
  EXPECT_EQ(Params(*server), expected);
}

TEST_F(ParameterServerTest, PullWaitsForTheVersion) {
  auto server = MakeServer(1);
  ASSERT_TRUE(server->Register("a", Signature(), {}).ok());
  std::vector<float> out(8);
  EXPECT_EQ(server->Pull(1, absl::Now() + absl::Milliseconds(20), absl::MakeSpan(out))
                .status()
                .code(),
            absl::StatusCode::kDeadlineExceeded);
  std::thread pusher([&] { PushAll(*server, 0, 0, 1.f, 1); });
  auto version = server->Pull(1, absl::Now() + absl::Seconds(10), absl::MakeSpan(out));
  pusher.join();
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_EQ(*version, 1);
}

TEST_F(ParameterServerTest, FirstWorkerSuppliesParametersWhenServerHasNone) {
  ParameterServerOptions options;
  auto server = ParameterServer::Create(options, {}, {}, &device_);
  ASSERT_TRUE(server.ok());
  auto reg = (*server)->Register("w", Signature(), Initial());
  ASSERT_TRUE(reg.ok()) << reg.status();
  EXPECT_EQ(Params(**server), Initial());
}

TEST_F(ParameterServerTest, RegistrationErrors) {
  auto server = MakeServer(1);
  EXPECT_EQ(server->Register("", Signature(), {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto sig = Signature();
  sig[1].shape = {3};
  auto mismatch = server->Register("a", sig, {});
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(mismatch.status().message()),
              HasSubstr("'fc.bias' has shape [2] on the server but [3] on the worker"));
  sig = Signature();
  sig[0].name = "conv.weight";
  EXPECT_THAT(std::string(server->Register("a", sig, {}).status().message()),
              HasSubstr("'fc.weight' on the server but 'conv.weight'"));
  ASSERT_TRUE(server->Register("a", Signature(), {}).ok());
  EXPECT_EQ(server->Register("a", Signature(), {})->rank, 0);  // re-registration
  EXPECT_EQ(server->Register("b", Signature(), {}).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST_F(ParameterServerTest, RequestedRanks) {
  auto server = MakeServer(2);
  auto b = server->Register("b", Signature(), {}, /*requested_rank=*/1);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->rank, 1);
  auto taken = server->Register("c", Signature(), {}, 1);
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(taken.status().message()), HasSubstr("already held by worker 'b'"));
  EXPECT_EQ(server->Register("c", Signature(), {}, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(server->Register("a", Signature(), {})->rank, 0);  // the free one
  EXPECT_EQ(server->Register("b", Signature(), {}, 1)->rank, 1);  // restart keeps it
}

TEST_F(ParameterServerTest, BadPushesAreRefusedAndChangeNothing) {
  auto server = MakeServer(1);
  ASSERT_TRUE(server->Register("a", Signature(), {}).ok());
  std::vector<float> four(4, 1.f), two(2, 1.f);
  // A good first chunk, then every kind of bad push.
  ASSERT_TRUE(server->Push(0, 0, 0, 0, 3, four).ok());
  struct Case {
    const char* what;
    absl::Status status;
    absl::StatusCode code;
    const char* message;
  };
  std::vector<float> with_nan = {1.f, NAN};
  const Case cases[] = {
      {"unknown worker", server->Push(3, 0, 0, 1, 3, two), absl::StatusCode::kNotFound,
       "unregistered worker rank 3"},
      {"unknown key", server->Push(0, 0, 7, 0, 3, two), absl::StatusCode::kOutOfRange,
       "key 7 out of range"},
      {"chunk out of range", server->Push(0, 0, 0, 2, 3, two), absl::StatusCode::kOutOfRange,
       "chunk 2 of key 'fc.weight' out of range"},
      {"wrong length", server->Push(0, 0, 0, 1, 3, four), absl::StatusCode::kInvalidArgument,
       "needs 2 elements, got 4"},
      {"duplicate", server->Push(0, 0, 0, 0, 3, four), absl::StatusCode::kAlreadyExists,
       "already pushed"},
      {"stale iteration", server->Push(0, 5, 0, 1, 3, two), absl::StatusCode::kFailedPrecondition,
       "iteration 5 but the server is at iteration 0"},
      {"sample count changes", server->Push(0, 0, 0, 1, 4, two),
       absl::StatusCode::kFailedPrecondition, "claims 4 samples"},
      {"NaN", server->Push(0, 0, 1, 0, 3, with_nan), absl::StatusCode::kInvalidArgument,
       "non-finite"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(c.status.code(), c.code) << c.what << ": " << c.status;
    EXPECT_THAT(std::string(c.status.message()), HasSubstr(c.message)) << c.what;
  }
  // Finish the iteration: the update reflects only the good pushes.
  ASSERT_TRUE(server->Push(0, 0, 0, 1, 3, two).ok());
  ASSERT_TRUE(server->Push(0, 0, 1, 0, 3, two).ok());
  EXPECT_EQ(server->version(), 1);
  std::vector<float> expected = Initial();
  for (float& x : expected) x -= 1.f / 3.f;
  const std::vector<float> params = Params(*server);
  for (int i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(params[i], expected[i]) << i;
}

}  // namespace
}  // namespace ps::server
