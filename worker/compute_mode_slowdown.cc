#include "worker/compute_mode_slowdown.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "absl/time/time.h"
#include "common/status_macros.h"

namespace ps::worker {

// Stretches a pass: at every hook (and once at its end) it sleeps
// (slowdown - 1) x the compute since the last one, then calls the inner
// hooks, if any. Time inside the inner BeforeForward (waiting for
// parameters) is not compute. What a sleep overshoots is owed back to the
// next one (many short sleeps would otherwise add up past the factor).
class SlowdownCompute::StretchingHooks final : public model::ParameterHooks {
 public:
  StretchingHooks(model::ParameterHooks* inner, const Clock* clock, double slowdown)
      : inner_(inner), clock_(clock), slowdown_(slowdown), mark_ns_(clock->NowNanos()) {}

  absl::Status BeforeForward(int64_t begin, int64_t end) override {
    Stretch();
    absl::Status status = inner_->BeforeForward(begin, end);
    mark_ns_ = clock_->NowNanos();  // waiting is not compute
    return status;
  }
  void GradientsReady(int64_t begin, int64_t end) override {
    Stretch();
    inner_->GradientsReady(begin, end);
  }
  void AfterBackward(int64_t begin, int64_t end) override {
    Stretch();
    inner_->AfterBackward(begin, end);
  }

  void Stretch() {
    const int64_t now = clock_->NowNanos();
    owed_ns_ += static_cast<int64_t>((slowdown_ - 1) * static_cast<double>(now - mark_ns_));
    if (owed_ns_ > 0) clock_->SleepFor(absl::Nanoseconds(owed_ns_));
    mark_ns_ = clock_->NowNanos();
    owed_ns_ -= mark_ns_ - now;
  }

 private:
  model::ParameterHooks* const inner_;  // null: no overlap, no hook is called
  const Clock* const clock_;
  const double slowdown_;
  int64_t mark_ns_;
  int64_t owed_ns_ = 0;
};

absl::Status SlowdownCompute::Prepare(const ComputeSetup& setup) {
  rank_ = setup.rank;
  return inner_->Prepare(setup);
}

double SlowdownCompute::SlowdownAt(int64_t iteration) const {
  if (period_ <= 0) return slowdown_;
  return (iteration / period_ + rank_) % 2 == 0 ? slowdown_ : 1;
}

absl::Status SlowdownCompute::Compute(ComputeStep& step) {
  const double slowdown = SlowdownAt(step.iteration);
  if (slowdown <= 1) return inner_->Compute(step);
  // Each device's hooks stretch its own pass, on its own thread.
  const std::vector<model::ParameterHooks*> overlap = step.overlap;
  std::vector<std::unique_ptr<StretchingHooks>> hooks;
  for (size_t d = 0; d < std::max<size_t>(1, overlap.size()); ++d) {
    hooks.push_back(std::make_unique<StretchingHooks>(overlap.empty() ? nullptr : overlap[d],
                                                      clock_, slowdown));
    if (!overlap.empty()) step.overlap[d] = hooks[d].get();
  }
  absl::Status status = inner_->Compute(step);
  step.overlap = overlap;
  PS_RETURN_IF_ERROR(status);
  // The pass's tail after its last hook (without overlap: all of it), on
  // device 0's timeline.
  hooks[0]->Stretch();
  return absl::OkStatus();
}

}  // namespace ps::worker
