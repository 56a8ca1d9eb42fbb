#ifndef PS_WORKER_COMPUTE_MODE_SLOWDOWN_H_
#define PS_WORKER_COMPUTE_MODE_SLOWDOWN_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "common/clock.h"
#include "worker/compute_mode.h"
#include "worker/compute_replay.h"

namespace ps::worker {

// An emulated slower host, for experiments (a worker with half the compute
// speed: 2), over any compute mode: each step's compute (or its replay)
// takes `slowdown` times as long, the worker sleeping on the clock
// (slowdown - 1) x the compute, waits for parameters (step.overlap's
// BeforeForward) left out. Overlapping, the sleep is cut at every layer
// hook, so each part of the pass is stretched and each layer's gradients
// are handed over when a slower host's would be; otherwise it all comes
// after the pass, before the trainer pushes.
class SlowdownCompute final : public ComputeMode {
 public:
  // `slowdown` > 1. `period` 0: every step is slowed; P > 0: a straggler
  // that moves: only the steps of alternate blocks of P, rank r's blocks
  // offset by r (with two workers one of them is the slow one at every
  // step, each half the time). `clock` must outlive this object.
  SlowdownCompute(std::unique_ptr<ComputeMode> inner, const Clock* clock, double slowdown,
                  int64_t period)
      : inner_(std::move(inner)), clock_(clock), slowdown_(slowdown), period_(period) {}

  std::string Name() const override { return inner_->Name(); }
  // Learns the rank (the turns), then prepares the inner mode (unslowed).
  absl::Status Prepare(const ComputeSetup& setup) override;
  bool reads_data() const override { return inner_->reads_data(); }
  absl::Status Compute(ComputeStep& step) override;
  const ComputeProfile* replay_profile() const override { return inner_->replay_profile(); }

  // The factor of step `iteration`: slowdown, or 1 outside this rank's turns.
  double SlowdownAt(int64_t iteration) const;

 private:
  class StretchingHooks;

  const std::unique_ptr<ComputeMode> inner_;
  const Clock* const clock_;
  const double slowdown_;
  const int64_t period_;
  int rank_ = 0;
};

}  // namespace ps::worker

#endif  // PS_WORKER_COMPUTE_MODE_SLOWDOWN_H_
