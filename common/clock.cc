#include "common/clock.h"

#include <chrono>
#include <vector>

namespace ps {
namespace {

class SteadyClock final : public Clock {
 public:
  int64_t NowNanos() const override {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
};

}  // namespace

Clock* Clock::Real() {
  static SteadyClock* const clock = new SteadyClock();  // never destroyed: used at exit too
  return clock;
}

bool Clock::AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& condition,
                              int64_t deadline_ns) const {
  for (;;) {
    const int64_t now = NowNanos();
    if (now >= deadline_ns) return condition.Eval();
    // Duration arithmetic saturates, so a far deadline cannot overflow.
    const absl::Duration left = deadline_ns == kNever
                                    ? absl::InfiniteDuration()
                                    : absl::Nanoseconds(deadline_ns) - absl::Nanoseconds(now);
    // absl's wait is on the wall clock: read this clock again on waking,
    // since the two may drift apart.
    if (mu->AwaitWithTimeout(condition, left)) return true;
  }
}

int64_t Clock::DeadlineAfter(absl::Duration timeout) const {
  const int64_t now = NowNanos();
  if (timeout <= absl::ZeroDuration()) return now;
  if (timeout == absl::InfiniteDuration()) return kNever;
  const int64_t ns = absl::ToInt64Nanoseconds(timeout);  // saturates at kNever
  if (now >= 0 && ns > kNever - now) return kNever;
  return now + ns;
}

void Clock::SleepUntil(int64_t deadline_ns) const {
  absl::Mutex mu;
  absl::MutexLock lock(&mu);
  const bool never = false;
  AwaitWithDeadline(&mu, absl::Condition(&never), deadline_ns);
}

void FakeClock::Advance(int64_t ns) {
  if (ns <= 0) return;
  // 1. Move the clock and pick the waiters it wakes (under mu_, so that
  //    WaitForWaiters sees both at once).
  std::vector<Waiter*> due;
  {
    absl::MutexLock lock(&mu_);
    const int64_t now = now_ns_.load(std::memory_order_relaxed) + ns;
    now_ns_.store(now, std::memory_order_release);
    for (Waiter* waiter : waiters_) {
      if (waiter->deadline_ns > now) continue;
      ++waiter->wakes_in_flight;
      due.push_back(waiter);
    }
  }
  // 2. Wake each: absl::Mutex re-evaluates its waiters' conditions when it
  //    is released, and each waiter's condition reads the clock. Outside
  //    mu_, so mu_ is never held while taking another lock (a waiter may
  //    hold other locks when it registers); wakes_in_flight keeps the
  //    waiter, and so its mutex, from going away meanwhile.
  for (Waiter* waiter : due) {
    waiter->mu->Lock();
    waiter->mu->Unlock();
  }
  absl::MutexLock lock(&mu_);
  for (Waiter* waiter : due) --waiter->wakes_in_flight;
}

bool FakeClock::AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& condition,
                                  int64_t deadline_ns) const {
  for (;;) {
    if (condition.Eval()) return true;
    if (NowNanos() >= deadline_ns) return false;
    // Registered and unregistered with `mu` released (see Advance). An
    // Advance between the check above and the registration is seen by the
    // condition below, which reads the clock before sleeping.
    Waiter waiter{mu, deadline_ns};
    mu->Unlock();
    std::list<Waiter*>::iterator registered;
    {
      absl::MutexLock lock(&mu_);
      registered = waiters_.insert(waiters_.end(), &waiter);
    }
    mu->Lock();
    auto woken = [&] { return condition.Eval() || NowNanos() >= deadline_ns; };
    mu->Await(absl::Condition(&woken));
    mu->Unlock();
    {
      absl::MutexLock lock(&mu_);
      auto let_go = [&waiter] { return waiter.wakes_in_flight == 0; };
      mu_.Await(absl::Condition(&let_go));
      waiters_.erase(registered);
    }
    mu->Lock();
    // The condition may have changed while `mu` was released: look again.
  }
}

int FakeClock::SleepingLocked() const {
  const int64_t now = NowNanos();
  int sleeping = 0;
  for (const Waiter* waiter : waiters_) sleeping += waiter->deadline_ns > now ? 1 : 0;
  return sleeping;
}

int FakeClock::waiters() const {
  absl::MutexLock lock(&mu_);
  return SleepingLocked();
}

bool FakeClock::WaitForWaiters(int n, absl::Duration real_timeout) const {
  absl::MutexLock lock(&mu_);
  auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return SleepingLocked() >= n; };
  return mu_.AwaitWithTimeout(absl::Condition(&enough), real_timeout);
}

}  // namespace ps
