#ifndef PS_COMMON_CLOCK_H_
#define PS_COMMON_CLOCK_H_

// Monotonic time, injected wherever code measures durations or waits for a
// deadline, so tests can drive time by hand, compare timings exactly and
// test timeouts without sleeping.
//
// Deadlines are readings of the clock they belong to (int64_t nanoseconds,
// `*_ns`), never absl::Time: a fake clock's reading has no relation to the
// wall clock. Where an API needs a wall-clock absl::Time (a gRPC call's
// deadline, another class's absl::Mutex wait), the caller converts the
// time left on its clock, and says why that wait is real time.

#include <atomic>
#include <cstdint>
#include <limits>
#include <list>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ps {

class Clock {
 public:
  // A deadline that never comes (DeadlineAfter(absl::InfiniteDuration())).
  static constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

  virtual ~Clock() = default;

  // Nanoseconds since an arbitrary origin fixed for the process; never
  // decreases. Thread-safe.
  virtual int64_t NowNanos() const = 0;

  // Waits, with `mu` held on entry and on return, until `condition` holds
  // (true) or this clock reads `deadline_ns` or later (false, with
  // `condition` false when it was evaluated last), like
  // absl::Mutex::AwaitWithDeadline; `mu` is released while waiting. The
  // condition is re-evaluated whenever `mu` is released by another thread,
  // so it must read only state guarded by `mu` (or atomics). Thread-safe.
  // The default waits in real time for the time left on this clock and
  // reads the clock again on waking, so it suits any clock that moves by
  // itself; a clock that moves only when told to (FakeClock) overrides it.
  virtual bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& condition,
                                 int64_t deadline_ns) const;

  // The reading `timeout` from now; kNever for an infinite (or overflowing)
  // timeout, NowNanos() for a negative one.
  int64_t DeadlineAfter(absl::Duration timeout) const;
  // Blocks the calling thread until this clock reads `deadline_ns` or later.
  void SleepUntil(int64_t deadline_ns) const;
  void SleepFor(absl::Duration duration) const { SleepUntil(DeadlineAfter(duration)); }

  // The process's steady clock (std::chrono::steady_clock). Never null, never
  // destroyed.
  static Clock* Real();
};

// A clock that moves only when told to, for tests: Advance moves it and
// wakes every AwaitWithDeadline (and SleepUntil) whose deadline it reaches,
// and WaitForWaiters lets a test know that the threads under test have gone
// to sleep on the clock, so it can assert what they did before, and did not
// do, at an exact reading. Thread-safe.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(int64_t start_ns = 0) : now_ns_(start_ns) {}

  int64_t NowNanos() const override { return now_ns_.load(std::memory_order_acquire); }

  // Moves the clock `ns` (>= 0; a negative step is ignored: the clock never
  // decreases) forward and wakes the waiters whose deadline has come;
  // returns once each of them has been told (not once it has run). The
  // caller must not hold a mutex that a waiter waits with.
  void Advance(int64_t ns);
  void Advance(absl::Duration duration) { Advance(absl::ToInt64Nanoseconds(duration)); }

  // Waits on `condition` as the contract of Clock::AwaitWithDeadline says,
  // waking when Advance reaches `deadline_ns`; never by real time.
  bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& condition,
                         int64_t deadline_ns) const override;

  // Blocks until at least `n` threads wait on this clock for a deadline it
  // has not reached (asleep, or about to be: a waiter counts from just
  // before it sleeps until it returns), or until `real_timeout` of real time
  // passes (false: a test's guard against a hang, never what decides its
  // outcome).
  bool WaitForWaiters(int n, absl::Duration real_timeout = absl::Seconds(30)) const;
  // How many threads wait on this clock for a deadline it has not reached.
  int waiters() const;

 private:
  struct Waiter {
    absl::Mutex* mu;  // the waiter's own, which Advance locks and unlocks to wake it
    int64_t deadline_ns;
    int wakes_in_flight = 0;  // Advance is using `mu`: it must outlive that
  };
  int SleepingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::atomic<int64_t> now_ns_;
  mutable absl::Mutex mu_;
  mutable std::list<Waiter*> waiters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps

#endif  // PS_COMMON_CLOCK_H_
