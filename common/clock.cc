#include "common/clock.h"

#include <chrono>

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

}  // namespace ps
