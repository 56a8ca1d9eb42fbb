#ifndef PS_WORKER_COMPUTE_MODE_H_
#define PS_WORKER_COMPUTE_MODE_H_

// How a worker computes a step's gradients: the real forward/backward
// (compute_mode_real.h, the default), the replay of a measured pass for
// experiments with more emulated hosts than cores (compute_mode_replay.h),
// and an emulated slower host over either (compute_mode_slowdown.h).
// MakeComputeMode (compute_mode_factory.h) builds one from options. The
// trainer stages the data, times the step's phases and moves the
// parameters; a compute mode fills the replicas' gradients, which is all
// that differs between experiments and training.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/device.h"
#include "common/tensor.h"
#include "common/timed_event.h"
#include "worker/compute_replay.h"
#include "worker/device_threads.h"
#include "worker/model/model.h"
#include "worker/model/parameter_hooks.h"

namespace ps::worker {

// What MakeComputeMode builds (TrainerOptions carries the same fields, set
// from the worker's --compute, --replay_*, --slowdown* flags).
struct ComputeModeOptions {
  // Compute replay (compute_mode_replay.h): Prepare times
  // replay_calibration_steps (>= 1) real passes after two warm-up ones, and
  // every step sleeps through their average instead of computing. One
  // device only.
  bool replay = false;
  int64_t replay_calibration_steps = 5;
  // > 0: the measured pass scaled to take this long, in seconds.
  double replay_step_seconds = 0;
  // An emulated slower host (compute_mode_slowdown.h): each step's compute
  // takes `slowdown` (>= 1; 1: none) times as long. slowdown_period P > 0:
  // only alternate blocks of P steps, rank r's blocks offset by r (0: every
  // step).
  double slowdown = 1;
  int64_t slowdown_period = 0;
};

// One device's replica and its part of a step's batch.
struct DeviceShard {
  Device* device = nullptr;
  model::Model* model = nullptr;
  int64_t size = 0;  // samples
  // Views of the shard's samples staged on the device (empty tensors when
  // nothing was staged: size 0, or a mode that reads no data).
  Tensor inputs;
  Tensor labels;
  // [2] on the device: the summed loss and the correct count, which a pass
  // adds to. Null where nothing accumulates (calibration).
  Tensor* metrics = nullptr;
};

// A training step's compute, lent by the trainer for one Compute call.
struct ComputeStep {
  int64_t iteration = 0;  // the global iteration (events' step)
  std::vector<DeviceShard> shards;  // device d's at d
  // Device d's work runs on thread d (shards.size() lanes).
  DeviceThreads* device_threads = nullptr;
  // Receives each device's kCompute event on DeviceLane(d). May be null.
  EventObserver* observer = nullptr;
  // Overlapping communication with compute: device d's hooks at d, through
  // which its forward waits for each layer's parameters and its backward
  // hands over each layer's gradients. Empty: no overlap (the trainer
  // pushes the gradients once every pass has returned).
  std::vector<model::ParameterHooks*> overlap;
  // Set with `overlap`: blocks until every layer's parameters are in, for a
  // replica that runs no pass (an empty shard) and so calls no hook.
  std::function<absl::Status()> await_all_parameters;
};

// What Prepare may use, lent for the call.
struct ComputeSetup {
  int rank = 0;  // this worker's (the slowdown's turns)
  // Stages training batch `pass` of an epoch's order (wrapping round the
  // epoch) on every device and returns the shards, each with at least one
  // sample staged, and no metrics: passes that time compute, not train.
  std::function<absl::StatusOr<std::vector<DeviceShard>>(int64_t pass)> stage_batch;
};

// The compute of a step. Not thread-safe: the trainer's thread calls
// Prepare once, then Compute once per step.
class ComputeMode {
 public:
  virtual ~ComputeMode() = default;

  // What the training report's `compute` field says: "real" or "replay" (a
  // slowdown says its inner mode's name).
  virtual std::string Name() const = 0;

  // Once, after the trainer has registered and loaded its parameters and
  // before the first Compute. Replay times its real passes here (run it
  // while the other workers wait, to measure it alone). The errors of
  // setup.stage_batch and of the passes it runs.
  virtual absl::Status Prepare(const ComputeSetup& setup) { return absl::OkStatus(); }

  // False: Compute reads no samples (the trainer stages none and passes the
  // shards' sizes only).
  virtual bool reads_data() const { return true; }

  // Fills every replica's flat_gradients() with the gradient of its shard's
  // loss sum (or, replaying, leaves the last real ones), calling
  // each device's step.overlap hooks when set. Returns the first device's error, or the
  // hooks' (a failed wait for parameters).
  virtual absl::Status Compute(ComputeStep& step) = 0;

  // The pass replayed; null for a mode that computes.
  virtual const ComputeProfile* replay_profile() const { return nullptr; }
};

}  // namespace ps::worker

#endif  // PS_WORKER_COMPUTE_MODE_H_
