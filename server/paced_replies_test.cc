#include "server/paced_replies.h"

#include <atomic>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::server {
namespace {

using ::testing::ElementsAre;

constexpr int64_t kModel = 1000;  // elements per iteration
const std::vector<int> kTwo = {0, 1};
const absl::Time kT0 = absl::FromUnixSeconds(1000);

PushPacer::Options Lead(int64_t elements, absl::Duration max_hold = absl::Seconds(1)) {
  PushPacer::Options options;
  options.max_lead_elements = elements;
  options.idle_after = absl::Milliseconds(20);
  options.max_hold = max_hold;
  return options;
}

// Records which replies were sent, in order.
class SentLog {
 public:
  PacedReplies::Reply ReplyNamed(int name) {
    return [this, name] {
      absl::MutexLock lock(&mu_);
      sent_.push_back(name);
    };
  }
  std::vector<int> sent() const {
    absl::MutexLock lock(&mu_);
    return sent_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<int> sent_;
};

PacedReplies::Push PushOf(int rank, int64_t elements) {
  return {.rank = rank, .iteration = 0, .elements = elements, .members = kTwo};
}

TEST(PacedRepliesTest, HoldsTheLeadersReplyAndSendsItWhenTheSlowestCatchesUp) {
  PacedReplies replies(Lead(100), /*answer_when_due=*/false);
  SentLog log;
  EXPECT_FALSE(replies.PaceOrAnswer(PushOf(1, 10), kModel, kT0, log.ReplyNamed(1)));
  EXPECT_FALSE(replies.PaceOrAnswer(PushOf(0, 100), kModel, kT0, log.ReplyNamed(2)));
  // 150 ahead of the pushing slowest: held.
  EXPECT_TRUE(replies.PaceOrAnswer(PushOf(0, 60), kModel, kT0 + absl::Milliseconds(1),
                                   log.ReplyNamed(3)));
  EXPECT_EQ(replies.held(), 1);
  EXPECT_THAT(log.sent(), ElementsAre(1, 2));
  // The slowest's push that brings it within the lead sends the held reply
  // first, then its own.
  EXPECT_FALSE(replies.PaceOrAnswer(PushOf(1, 60), kModel, kT0 + absl::Milliseconds(2),
                                    log.ReplyNamed(4)));
  EXPECT_THAT(log.sent(), ElementsAre(1, 2, 3, 4));
  EXPECT_EQ(replies.held(), 0);
}

TEST(PacedRepliesTest, AHeldReplyGoesWhenDueAndNotBefore) {
  PacedReplies replies(Lead(100, /*max_hold=*/absl::Seconds(1)), /*answer_when_due=*/false);
  SentLog log;
  replies.PaceOrAnswer(PushOf(1, 10), kModel, kT0, log.ReplyNamed(1));
  ASSERT_TRUE(replies.PaceOrAnswer(PushOf(0, 200), kModel, kT0, log.ReplyNamed(2)));
  // The slowest pushed at kT0: not idle before 20 ms have passed.
  EXPECT_EQ(replies.AnswerDue(kT0 + absl::Milliseconds(19)), 0);
  EXPECT_THAT(log.sent(), ElementsAre(1));
  EXPECT_EQ(replies.AnswerDue(kT0 + absl::Milliseconds(20)), 1);
  EXPECT_THAT(log.sent(), ElementsAre(1, 2));
  EXPECT_EQ(replies.AnswerDue(kT0 + absl::Seconds(5)), 0);
}

TEST(PacedRepliesTest, ShutdownSendsEveryHeldReplyAndHoldsNoneAfter) {
  PacedReplies replies(Lead(100), /*answer_when_due=*/false);
  SentLog log;
  replies.PaceOrAnswer(PushOf(1, 10), kModel, kT0, log.ReplyNamed(1));
  ASSERT_TRUE(replies.PaceOrAnswer(PushOf(0, 200), kModel, kT0, log.ReplyNamed(2)));
  replies.Shutdown();
  EXPECT_THAT(log.sent(), ElementsAre(1, 2));
  // Far ahead, but the pacer is closed: sent at once.
  EXPECT_FALSE(replies.PaceOrAnswer(PushOf(0, 900), kModel, kT0, log.ReplyNamed(3)));
  EXPECT_THAT(log.sent(), ElementsAre(1, 2, 3));
  replies.Shutdown();  // idempotent
  EXPECT_EQ(replies.held(), 0);
}

TEST(PacedRepliesTest, WithoutALeadNothingIsHeld) {
  PacedReplies replies(Lead(0));
  SentLog log;
  EXPECT_FALSE(replies.PaceOrAnswer(PushOf(0, 999), kModel, kT0, log.ReplyNamed(1)));
  EXPECT_THAT(log.sent(), ElementsAre(1));
}

// The thread sends a held reply at its due time on the real clock, without
// any further push.
TEST(PacedRepliesTest, TheThreadSendsAHeldReplyOnceTheSlowestIsIdle) {
  PacedReplies replies(Lead(100));
  absl::Notification sent;
  const absl::Time start = absl::Now();
  replies.PaceOrAnswer(PushOf(1, 10), kModel, start, [] {});
  ASSERT_TRUE(replies.PaceOrAnswer(PushOf(0, 200), kModel, start, [&] { sent.Notify(); }));
  ASSERT_TRUE(sent.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(20));
  EXPECT_EQ(replies.held(), 0);
}

TEST(PacedRepliesTest, AModelSizeGivenLaterCountsInOneUnit) {
  // Built before the model is known: the first size given is used, so rank
  // 0 one element into iteration 1 is 3 ahead of rank 1 at 6 of 8.
  PacedReplies replies(Lead(2), /*answer_when_due=*/false);
  SentLog log;
  replies.PaceOrAnswer({1, 0, 6, kTwo}, /*elements_per_iteration=*/8, kT0, log.ReplyNamed(1));
  replies.PaceOrAnswer({0, 0, 8, kTwo}, 8, kT0, log.ReplyNamed(2));
  EXPECT_TRUE(replies.PaceOrAnswer({0, 1, 1, kTwo}, /*ignored=*/1000, kT0, log.ReplyNamed(3)));
  EXPECT_THAT(log.sent(), ElementsAre(1, 2));
}

}  // namespace
}  // namespace ps::server
