#include "common/clock.h"

#include <atomic>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

constexpr int64_t kSecond = 1'000'000'000;

TEST(FakeClockTest, ASleeperWakesExactlyWhenTheClockReachesItsDeadline) {
  FakeClock clock(5 * kSecond);
  std::atomic<bool> woke{false};
  std::thread sleeper([&] {
    clock.SleepFor(absl::Seconds(10));
    woke = true;
  });
  ASSERT_TRUE(clock.WaitForWaiters(1));
  clock.Advance(absl::Seconds(10) - absl::Nanoseconds(1));
  // Still registered with its deadline ahead: it has not returned.
  ASSERT_TRUE(clock.WaitForWaiters(1));
  EXPECT_FALSE(woke);
  clock.Advance(1);
  sleeper.join();
  EXPECT_TRUE(woke);
  EXPECT_EQ(clock.NowNanos(), 15 * kSecond);
  EXPECT_EQ(clock.waiters(), 0);
}

TEST(FakeClockTest, AdvanceWakesOnlyTheWaitersWhoseDeadlineHasCome) {
  FakeClock clock;
  std::atomic<int> woke{0};
  std::thread first([&] {
    clock.SleepUntil(1 * kSecond);
    ++woke;
  });
  std::thread second([&] {
    clock.SleepUntil(3 * kSecond);
    ++woke;
  });
  ASSERT_TRUE(clock.WaitForWaiters(2));
  clock.Advance(absl::Seconds(2));
  first.join();
  EXPECT_EQ(woke, 1);
  EXPECT_EQ(clock.waiters(), 1);
  clock.Advance(absl::Seconds(1));
  second.join();
  EXPECT_EQ(woke, 2);
}

TEST(FakeClockTest, AConditionThatComesTrueWakesTheWaiterWithoutTheClockMoving) {
  FakeClock clock;
  absl::Mutex mu;
  bool ready = false;
  bool result = false;
  std::thread waiter([&] {
    absl::MutexLock lock(&mu);
    result = clock.AwaitWithDeadline(&mu, absl::Condition(&ready), clock.DeadlineAfter(absl::Seconds(1)));
  });
  ASSERT_TRUE(clock.WaitForWaiters(1));
  {
    absl::MutexLock lock(&mu);
    ready = true;
  }
  waiter.join();
  EXPECT_TRUE(result);
  EXPECT_EQ(clock.NowNanos(), 0);
}

TEST(FakeClockTest, AWaitTimesOutWhenTheClockPassesTheDeadlineWithTheConditionFalse) {
  FakeClock clock;
  absl::Mutex mu;
  bool ready = false;
  bool result = true;
  std::thread waiter([&] {
    absl::MutexLock lock(&mu);
    result = clock.AwaitWithDeadline(&mu, absl::Condition(&ready), kSecond);
  });
  ASSERT_TRUE(clock.WaitForWaiters(1));
  clock.Advance(absl::Seconds(5));  // past it, not onto it
  waiter.join();
  EXPECT_FALSE(result);
}

TEST(FakeClockTest, APassedDeadlineAnswersAtOnceWithTheCondition) {
  FakeClock clock(10);
  absl::Mutex mu;
  absl::MutexLock lock(&mu);
  bool value = false;
  EXPECT_FALSE(clock.AwaitWithDeadline(&mu, absl::Condition(&value), 10));
  value = true;
  EXPECT_TRUE(clock.AwaitWithDeadline(&mu, absl::Condition(&value), 10));
  EXPECT_TRUE(clock.AwaitWithDeadline(&mu, absl::Condition(&value), Clock::kNever));
  EXPECT_EQ(clock.waiters(), 0);
}

TEST(FakeClockTest, NeverGoesBackwards) {
  FakeClock clock(100);
  clock.Advance(-50);
  EXPECT_EQ(clock.NowNanos(), 100);
}

TEST(FakeClockTest, WaitForWaitersGivesUpAfterItsRealTimeout) {
  FakeClock clock;
  EXPECT_FALSE(clock.WaitForWaiters(1, absl::Milliseconds(1)));
}

TEST(ClockTest, DeadlineAfterSaturates) {
  FakeClock clock(kSecond);
  EXPECT_EQ(clock.DeadlineAfter(absl::Milliseconds(1)), kSecond + 1'000'000);
  EXPECT_EQ(clock.DeadlineAfter(absl::InfiniteDuration()), Clock::kNever);
  EXPECT_EQ(clock.DeadlineAfter(absl::Hours(1e9)), Clock::kNever);
  EXPECT_EQ(clock.DeadlineAfter(-absl::Seconds(1)), kSecond);
  EXPECT_EQ(clock.DeadlineAfter(absl::ZeroDuration()), kSecond);
}

TEST(ClockTest, TheRealClockTimesOutInRealTime) {
  const Clock* clock = Clock::Real();
  absl::Mutex mu;
  absl::MutexLock lock(&mu);
  bool ready = false;
  const int64_t start = clock->NowNanos();
  const int64_t deadline = clock->DeadlineAfter(absl::Milliseconds(20));
  EXPECT_FALSE(clock->AwaitWithDeadline(&mu, absl::Condition(&ready), deadline));
  EXPECT_GE(clock->NowNanos(), deadline);
  EXPECT_GE(clock->NowNanos() - start, 20'000'000);
}

TEST(ClockTest, TheRealClockWakesForTheCondition) {
  const Clock* clock = Clock::Real();
  absl::Mutex mu;
  bool ready = false;
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(5));
    absl::MutexLock lock(&mu);
    ready = true;
  });
  {
    absl::MutexLock lock(&mu);
    EXPECT_TRUE(clock->AwaitWithDeadline(&mu, absl::Condition(&ready), Clock::kNever));
  }
  setter.join();
}

// A clock that implements NowNanos only gets the default wait, which reads
// that clock (here 1 h ahead of the real one), not the wall clock.
class OffsetClock final : public Clock {
 public:
  int64_t NowNanos() const override { return Clock::Real()->NowNanos() + 3600 * kSecond; }
};

TEST(ClockTest, TheDefaultWaitFollowsTheClocksOwnReading) {
  OffsetClock clock;
  absl::Mutex mu;
  absl::MutexLock lock(&mu);
  bool ready = false;
  const int64_t deadline = clock.DeadlineAfter(absl::Milliseconds(10));
  EXPECT_FALSE(clock.AwaitWithDeadline(&mu, absl::Condition(&ready), deadline));
  EXPECT_GE(clock.NowNanos(), deadline);
  const int64_t before = clock.NowNanos();
  clock.SleepFor(absl::Milliseconds(10));
  EXPECT_GE(clock.NowNanos() - before, 10'000'000);
}

}  // namespace
}  // namespace ps
