#include "server/waiting_pulls.h"

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::server {
namespace {

using ChunkId = ParameterServer::ChunkId;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

const absl::Time kT0 = absl::FromUnixSeconds(1000);

// A store whose chunk versions the test sets by hand.
class FakeReadiness final : public PullReadiness {
 public:
  void SetChunk(int key, int64_t chunk, int64_t version) {
    absl::MutexLock lock(&mu_);
    chunks_[{key, chunk}] = version;
  }
  void SetVersion(int64_t version) {
    absl::MutexLock lock(&mu_);
    version_ = version;
  }
  void ReleaseHeldBack() {
    absl::MutexLock lock(&mu_);
    ++releases_;
  }

  bool HasVersion(int64_t version) const override {
    absl::MutexLock lock(&mu_);
    return version_ >= version;
  }
  bool HasChunks(int64_t version, absl::Span<const ChunkId> chunks) const override {
    absl::MutexLock lock(&mu_);
    if (chunks.empty()) return version_ >= version;
    for (const ChunkId& id : chunks) {
      auto it = chunks_.find({id.key, id.chunk});
      if (it == chunks_.end() || it->second < version) return false;
    }
    return true;
  }
  int64_t held_back_releases() const override {
    absl::MutexLock lock(&mu_);
    return releases_;
  }

 private:
  mutable absl::Mutex mu_;
  int64_t version_ = -1;  // the whole store's; -1: not even version 0
  std::map<std::pair<int, int64_t>, int64_t> chunks_;
  int64_t releases_ = 0;
};

// A pull that records how it was answered ("now", or the refusal's
// message), and every answer, so a second one shows.
class FakePull final : public WaitingPull {
 public:
  FakePull(int64_t version, std::vector<ChunkId> ids, absl::Time deadline)
      : WaitingPull(version, std::move(ids), deadline) {}

  void AnswerNow() override { Record("now", absl::OkStatus()); }
  void Refuse(const absl::Status& status) override { Record(status.ToString(), status); }

  std::vector<std::string> answers() const {
    absl::MutexLock lock(&mu_);
    return answers_;
  }
  absl::StatusCode code() const {
    absl::MutexLock lock(&mu_);
    return code_;
  }
  bool WaitForAnswer(absl::Duration timeout) { return answered_.WaitForNotificationWithTimeout(timeout); }

 private:
  void Record(std::string answer, const absl::Status& status) {
    absl::MutexLock lock(&mu_);
    answers_.push_back(std::move(answer));
    code_ = status.code();
    if (!answered_.HasBeenNotified()) answered_.Notify();
  }

  mutable absl::Mutex mu_;
  std::vector<std::string> answers_;
  absl::StatusCode code_ = absl::StatusCode::kOk;
  absl::Notification answered_;
};

WaitingPulls::Options NoThread(int64_t max_pulls = 100) {
  return {.max_pulls = max_pulls, .answer_at_deadlines = false};
}

TEST(WaitingPullsTest, AWaitIsTheTimeoutCappedAtAnHourAndTheCallsDeadline) {
  EXPECT_EQ(WaitDeadline(kT0, 250, absl::InfiniteFuture()), kT0 + absl::Milliseconds(250));
  EXPECT_EQ(WaitDeadline(kT0, -5, absl::InfiniteFuture()), kT0);
  EXPECT_EQ(WaitDeadline(kT0, INT64_MAX, absl::InfiniteFuture()), kT0 + absl::Hours(1));
  EXPECT_EQ(WaitDeadline(kT0, 5000, kT0 + absl::Seconds(2)), kT0 + absl::Seconds(2));
}

TEST(WaitingPullsTest, APullWhoseChunksExistIsAnsweredAtOnceAndNotFiled) {
  FakeReadiness store;
  store.SetVersion(0);
  store.SetChunk(1, 0, 3);
  WaitingPulls pulls(&store, NoThread());
  FakePull pull(3, {{1, 0}}, kT0);
  pulls.File(&pull);
  EXPECT_THAT(pull.answers(), ElementsAre("now"));
  EXPECT_EQ(pulls.size(), 0);
}

TEST(WaitingPullsTest, AWaitingPullIsAnsweredOnceEveryChunkItNeedsWasSent) {
  FakeReadiness store;
  store.SetVersion(0);
  WaitingPulls pulls(&store, NoThread());
  FakePull pull(1, {{1, 0}, {2, 0}}, kT0 + absl::Hours(1));
  pulls.File(&pull);
  EXPECT_EQ(pulls.size(), 1);
  // Key 1 arrives: the pull now waits for key 2.
  store.SetChunk(1, 0, 1);
  pulls.AnswerReady({{1, 0}});
  EXPECT_THAT(pull.answers(), IsEmpty());
  // A call that sent something else does not answer it, even now that key
  // 2 exists: the pull is filed under key 2 only.
  store.SetChunk(2, 0, 1);
  pulls.AnswerReady({{7, 0}});
  EXPECT_THAT(pull.answers(), IsEmpty());
  pulls.AnswerReady({{2, 0}});
  EXPECT_THAT(pull.answers(), ElementsAre("now"));
  EXPECT_EQ(pulls.size(), 0);
  pulls.AnswerReady({{1, 0}, {2, 0}});
  EXPECT_THAT(pull.answers(), ElementsAre("now"));  // once
}

TEST(WaitingPullsTest, BeforeVersionZeroAndForTheStoresVersionAnyCallMayAnswer) {
  FakeReadiness store;  // no version 0 yet
  WaitingPulls pulls(&store, NoThread());
  FakePull chunk_pull(0, {{1, 0}}, kT0 + absl::Hours(1));
  FakePull version_pull(2, {}, kT0 + absl::Hours(1));  // a Wait
  pulls.File(&chunk_pull);
  pulls.File(&version_pull);
  store.SetVersion(0);
  store.SetChunk(1, 0, 0);
  pulls.AnswerReady({});  // e.g. a Register that completed version 0
  EXPECT_THAT(chunk_pull.answers(), ElementsAre("now"));
  EXPECT_THAT(version_pull.answers(), IsEmpty());
  store.SetVersion(2);
  pulls.AnswerReady({{9, 9}});
  EXPECT_THAT(version_pull.answers(), ElementsAre("now"));
}

TEST(WaitingPullsTest, ReleasedHeldBackUpdatesMakeEveryPullACandidate) {
  FakeReadiness store;
  store.SetVersion(0);
  WaitingPulls pulls(&store, NoThread());
  FakePull pull(1, {{1, 0}}, kT0 + absl::Hours(1));
  pulls.File(&pull);
  store.SetChunk(1, 0, 1);  // published by a release, not by a sender
  pulls.AnswerReady({{5, 0}});
  EXPECT_THAT(pull.answers(), IsEmpty());
  store.ReleaseHeldBack();
  pulls.AnswerReady({{5, 0}});
  EXPECT_THAT(pull.answers(), ElementsAre("now"));
}

TEST(WaitingPullsTest, DeadlinesAnswerThePullsDueByTheTimeGivenNearestFirst) {
  FakeReadiness store;
  store.SetVersion(0);
  WaitingPulls pulls(&store, NoThread());
  FakePull late(1, {{1, 0}}, kT0 + absl::Seconds(2));
  FakePull early(1, {{1, 0}}, kT0 + absl::Seconds(1));
  pulls.File(&late);
  pulls.File(&early);
  EXPECT_EQ(pulls.next_deadline(), kT0 + absl::Seconds(1));
  EXPECT_EQ(pulls.AnswerDue(kT0 + absl::Milliseconds(999)), 0);
  EXPECT_EQ(pulls.AnswerDue(kT0 + absl::Seconds(1)), 1);
  EXPECT_THAT(early.answers(), ElementsAre("now"));
  EXPECT_THAT(late.answers(), IsEmpty());
  EXPECT_EQ(pulls.next_deadline(), kT0 + absl::Seconds(2));
  EXPECT_EQ(pulls.AnswerDue(kT0 + absl::Hours(1)), 1);
  EXPECT_THAT(late.answers(), ElementsAre("now"));
  EXPECT_EQ(pulls.next_deadline(), absl::InfiniteFuture());
}

TEST(WaitingPullsTest, AWithdrawnPullIsTheCallersAndNobodyElseAnswersIt) {
  FakeReadiness store;
  store.SetVersion(0);
  WaitingPulls pulls(&store, NoThread());
  FakePull pull(1, {{1, 0}}, kT0);
  pulls.File(&pull);
  EXPECT_TRUE(pulls.Withdraw(&pull));
  EXPECT_FALSE(pulls.Withdraw(&pull));
  store.SetChunk(1, 0, 1);
  pulls.AnswerReady({{1, 0}});
  EXPECT_EQ(pulls.AnswerDue(kT0 + absl::Hours(1)), 0);
  pulls.Close(absl::UnavailableError("bye"));
  EXPECT_THAT(pull.answers(), IsEmpty());
  // And one answered already cannot be withdrawn.
  FakePull answered(1, {{1, 0}}, kT0);
  pulls.File(&answered);
  EXPECT_FALSE(pulls.Withdraw(&answered));
}

TEST(WaitingPullsTest, CloseRefusesEveryWaitingPullWithItsStatusAndLaterOnesAsShuttingDown) {
  FakeReadiness store;
  store.SetVersion(0);
  WaitingPulls pulls(&store, NoThread());
  FakePull a(1, {{1, 0}}, kT0), b(1, {}, kT0);
  pulls.File(&a);
  pulls.File(&b);
  pulls.Close(absl::FailedPreconditionError("the job failed"));
  EXPECT_EQ(a.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(b.answers(), ElementsAre(HasSubstr("the job failed")));
  FakePull later(1, {{1, 0}}, kT0);
  pulls.File(&later);
  EXPECT_EQ(later.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(later.answers(), ElementsAre(HasSubstr("server shutting down")));
  pulls.Close(absl::UnavailableError("again"));  // idempotent
  EXPECT_THAT(a.answers(), ::testing::SizeIs(1));
}

TEST(WaitingPullsTest, PullsBeyondTheCapAreRefusedNamingIt) {
  FakeReadiness store;
  store.SetVersion(0);
  WaitingPulls pulls(&store, NoThread(/*max_pulls=*/2));
  FakePull a(1, {{1, 0}}, kT0), b(1, {{1, 0}}, kT0), c(1, {{1, 0}}, kT0);
  pulls.File(&a);
  pulls.File(&b);
  pulls.File(&c);
  EXPECT_EQ(pulls.size(), 2);
  EXPECT_EQ(c.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(c.answers(), ElementsAre(HasSubstr("max_waiting_pulls = 2")));
  // Room again once one is answered.
  store.SetChunk(1, 0, 1);
  pulls.AnswerReady({{1, 0}});
  FakePull d(2, {{1, 0}}, kT0);
  pulls.File(&d);
  EXPECT_EQ(pulls.size(), 1);
  EXPECT_THAT(d.answers(), IsEmpty());
  pulls.Close(absl::UnavailableError("server shutting down"));  // before d goes
  EXPECT_EQ(d.code(), absl::StatusCode::kUnavailable);
}

TEST(WaitingPullsTest, TheDeadlineThreadAnswersAtTheDeadlineWithoutAnyCall) {
  FakeReadiness store;
  store.SetVersion(0);
  WaitingPulls pulls(&store, {.max_pulls = 10, .answer_at_deadlines = true});
  const absl::Time start = absl::Now();
  FakePull far(1, {{1, 0}}, start + absl::Hours(1));
  FakePull near(1, {{1, 0}}, start + absl::Milliseconds(100));
  pulls.File(&far);
  pulls.File(&near);  // nearer than the one the thread sleeps for
  ASSERT_TRUE(near.WaitForAnswer(absl::Seconds(10)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(100));
  EXPECT_THAT(near.answers(), ElementsAre("now"));
  EXPECT_THAT(far.answers(), IsEmpty());
  pulls.Close(absl::UnavailableError("server shutting down"));
  EXPECT_EQ(far.code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace ps::server
