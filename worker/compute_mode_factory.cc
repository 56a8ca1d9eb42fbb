#include "worker/compute_mode_factory.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/compute_mode_real.h"
#include "worker/compute_mode_replay.h"
#include "worker/compute_mode_slowdown.h"

namespace ps::worker {

absl::StatusOr<std::unique_ptr<ComputeMode>> MakeComputeMode(const ComputeModeOptions& options,
                                                             int num_devices, const Clock* clock) {
  if (clock == nullptr) return absl::InvalidArgumentError("compute mode needs a clock");
  if (!(options.slowdown >= 1) || options.slowdown_period < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "slowdown must be >= 1 (1: none) and its period >= 0, got ", options.slowdown, " and ",
        options.slowdown_period));
  }
  std::unique_ptr<ComputeMode> mode;
  if (options.replay) {
    if (num_devices != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("compute replay runs on one device, not ", num_devices));
    }
    if (options.replay_calibration_steps < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("compute replay needs at least one calibration step, got ",
                       options.replay_calibration_steps));
    }
    mode = std::make_unique<ReplayCompute>(clock, options.replay_calibration_steps,
                                           options.replay_step_seconds);
  } else {
    mode = std::make_unique<RealCompute>(clock);
  }
  if (options.slowdown > 1) {
    mode = std::make_unique<SlowdownCompute>(std::move(mode), clock, options.slowdown,
                                             options.slowdown_period);
  }
  return mode;
}

}  // namespace ps::worker
