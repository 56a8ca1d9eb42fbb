#ifndef PS_WORKER_COMPUTE_MODE_REPLAY_H_
#define PS_WORKER_COMPUTE_MODE_REPLAY_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/clock.h"
#include "worker/compute_mode.h"
#include "worker/compute_replay.h"

namespace ps::worker {

// Compute replay (compute_replay.h), for experiments with more emulated
// hosts than the machine has cores. Prepare runs two warm-up passes and
// then times `calibration_steps` real forward/backward passes of device
// 0's replica, on the training batches 0, 1, ... it stages; then every
// Compute sleeps through that average pass on the clock instead of
// computing, point by point, and at each point does what the pass did
// there through step.overlap's hooks (waiting for a layer's parameters,
// handing over a layer's gradients), so the last real gradient is pushed
// at the measured moments. No data is read; the loss and accuracy read 0.
// One device only (MakeComputeMode refuses more).
class ReplayCompute final : public ComputeMode {
 public:
  // `calibration_steps` >= 1; `step_seconds` > 0 scales the measured pass
  // (every gap in proportion) to take that long, so runs compare at one
  // compute time whatever else loads the machine while they calibrate.
  // `clock` measures the passes and is what the replay sleeps on; it must
  // outlive this object.
  ReplayCompute(const Clock* clock, int64_t calibration_steps, double step_seconds)
      : clock_(clock), calibration_steps_(calibration_steps), step_seconds_(step_seconds) {}

  std::string Name() const override { return "replay"; }
  // kFailedPrecondition if the passes reach different points.
  absl::Status Prepare(const ComputeSetup& setup) override;
  bool reads_data() const override { return false; }
  absl::Status Compute(ComputeStep& step) override;
  const ComputeProfile* replay_profile() const override { return &profile_; }

 private:
  static constexpr int64_t kWarmupPasses = 2;

  const Clock* const clock_;
  const int64_t calibration_steps_;
  const double step_seconds_;
  ComputeProfile profile_;
};

}  // namespace ps::worker

#endif  // PS_WORKER_COMPUTE_MODE_REPLAY_H_
