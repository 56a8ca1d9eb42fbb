#ifndef PS_WORKER_COMPUTE_MODE_TEST_UTIL_H_
#define PS_WORKER_COMPUTE_MODE_TEST_UTIL_H_

// Test doubles for the compute modes' tests.

#include <atomic>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "worker/model/parameter_hooks.h"

namespace ps::worker::testing {

// A clock that moves only when told to (Advance) or when someone sleeps on
// it: a sleep jumps the clock to its deadline at once and is recorded, so a
// test sees exactly how long the code under test slept, without sleeping.
// `tick_ns` > 0: every reading also moves the clock that much first, so
// every measured interval is known. Single-threaded use.
class JumpingClock final : public Clock {
 public:
  explicit JumpingClock(int64_t tick_ns = 0) : tick_ns_(tick_ns) {}

  int64_t NowNanos() const override { return now_ns_ += tick_ns_; }
  bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& condition,
                         int64_t deadline_ns) const override {
    if (condition.Eval()) return true;
    const int64_t now = now_ns_;
    sleeps_ns_.push_back(deadline_ns > now ? deadline_ns - now : 0);
    if (deadline_ns > now) now_ns_ = deadline_ns;
    return condition.Eval();
  }

  void Advance(int64_t ns) { now_ns_ += ns; }
  // What each sleep asked for, in order (0 for a deadline already past).
  const std::vector<int64_t>& sleeps_ns() const { return sleeps_ns_; }
  int64_t slept_ns() const {
    int64_t total = 0;
    for (int64_t ns : sleeps_ns_) total += ns;
    return total;
  }

 private:
  const int64_t tick_ns_;
  mutable int64_t now_ns_ = 0;
  mutable std::vector<int64_t> sleeps_ns_;
};

// Records each hook call with the clock's reading; BeforeForward advances a
// JumpingClock by `wait_ns` (a wait for parameters) when one is given.
class RecordingHooks final : public model::ParameterHooks {
 public:
  enum Kind { kBeforeForward, kGradientsReady, kAfterBackward };
  struct Call {
    Kind kind;
    int64_t begin, end;
    int64_t at_ns;  // the clock's reading when the call came
  };

  explicit RecordingHooks(const Clock* clock, JumpingClock* waits_on = nullptr,
                          int64_t wait_ns = 0)
      : clock_(clock), waits_on_(waits_on), wait_ns_(wait_ns) {}

  absl::Status BeforeForward(int64_t begin, int64_t end) override {
    calls_.push_back({kBeforeForward, begin, end, clock_->NowNanos()});
    if (waits_on_ != nullptr) waits_on_->Advance(wait_ns_);
    return absl::OkStatus();
  }
  void GradientsReady(int64_t begin, int64_t end) override {
    calls_.push_back({kGradientsReady, begin, end, clock_->NowNanos()});
  }
  void AfterBackward(int64_t begin, int64_t end) override {
    calls_.push_back({kAfterBackward, begin, end, clock_->NowNanos()});
  }

  const std::vector<Call>& calls() const { return calls_; }

 private:
  const Clock* const clock_;
  JumpingClock* const waits_on_;
  const int64_t wait_ns_;
  std::vector<Call> calls_;
};

}  // namespace ps::worker::testing

#endif  // PS_WORKER_COMPUTE_MODE_TEST_UTIL_H_
