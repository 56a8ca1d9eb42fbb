#ifndef PS_COMMON_CLOCK_H_
#define PS_COMMON_CLOCK_H_

// Monotonic time, injected wherever code measures durations, so tests can
// drive time by hand and compare timings exactly.

#include <atomic>
#include <cstdint>

namespace ps {

class Clock {
 public:
  virtual ~Clock() = default;

  // Nanoseconds since an arbitrary origin fixed for the process; never
  // decreases. Thread-safe.
  virtual int64_t NowNanos() const = 0;

  // The process's steady clock (std::chrono::steady_clock). Never null, never
  // destroyed.
  static Clock* Real();
};

// A clock that moves only when told to. Thread-safe.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(int64_t start_ns = 0) : now_ns_(start_ns) {}

  int64_t NowNanos() const override { return now_ns_.load(std::memory_order_relaxed); }
  void Advance(int64_t ns) { now_ns_.fetch_add(ns, std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> now_ns_;
};

}  // namespace ps

#endif  // PS_COMMON_CLOCK_H_
