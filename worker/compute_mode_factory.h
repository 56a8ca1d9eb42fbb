#ifndef PS_WORKER_COMPUTE_MODE_FACTORY_H_
#define PS_WORKER_COMPUTE_MODE_FACTORY_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "worker/compute_mode.h"

namespace ps::worker {

// The compute mode `options` ask for, for a worker with `num_devices`
// devices: real or replay, under a slowdown when options.slowdown > 1.
// kInvalidArgument, naming the bad value or combination: slowdown below 1 (or
// not a number) or a negative period; replay on more than one device, or
// with fewer than one calibration step. `clock` (what the modes measure and
// sleep on) must be non-null and outlive the mode.
absl::StatusOr<std::unique_ptr<ComputeMode>> MakeComputeMode(const ComputeModeOptions& options,
                                                             int num_devices, const Clock* clock);

}  // namespace ps::worker

#endif  // PS_WORKER_COMPUTE_MODE_FACTORY_H_
