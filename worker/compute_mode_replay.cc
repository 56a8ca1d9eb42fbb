#include "worker/compute_mode_replay.h"

#include <vector>

#include "absl/time/time.h"
#include "common/status_macros.h"
#include "common/timed_event.h"

namespace ps::worker {

absl::Status ReplayCompute::Prepare(const ComputeSetup& setup) {
  ProfilingHooks hooks(clock_);
  for (int64_t pass = 0; pass < kWarmupPasses + calibration_steps_; ++pass) {
    PS_ASSIGN_OR_RETURN(std::vector<DeviceShard> shards, setup.stage_batch(pass));
    DeviceShard& shard = shards[0];
    model::Model& model = *shard.model;
    model.set_step(-1);  // no training step's events
    const bool timed = pass >= kWarmupPasses;
    if (timed) {
      model.set_parameter_hooks(&hooks);
      hooks.BeginPass();
    }
    absl::StatusOr<model::DeviceMetrics> metrics = model.ForwardBackward(shard.inputs, shard.labels);
    model.set_parameter_hooks(nullptr);
    PS_RETURN_IF_ERROR(metrics.status());
    PS_RETURN_IF_ERROR(shard.device->Synchronize());
    if (timed) PS_RETURN_IF_ERROR(hooks.EndPass());
  }
  profile_ = hooks.profile();
  if (step_seconds_ > 0 && profile_.step_ns() > 0) {
    const double scale = step_seconds_ * 1e9 / static_cast<double>(profile_.step_ns());
    for (ComputeProfile::Point& point : profile_.points) {
      point.gap_ns = static_cast<int64_t>(static_cast<double>(point.gap_ns) * scale);
    }
  }
  return absl::OkStatus();
}

absl::Status ReplayCompute::Compute(ComputeStep& step) {
  // The measured pass, point by point: sleep through each gap, then do what
  // the pass did there, through the hooks a real pass would call. The sleep
  // is on the trainer's clock, which measured the pass (real time in a
  // worker: the replay stands in for real work).
  ScopedEvent event(step.observer, clock_, EventKind::kCompute, DeviceLane(0), step.iteration);
  // Several devices: every replica reaches each point at once (one pass
  // stands for all of them), so each device's hooks hear it in turn.
  for (const ComputeProfile::Point& point : profile_.points) {
    clock_->SleepFor(absl::Nanoseconds(point.gap_ns));
    for (model::ParameterHooks* hooks : step.overlap) {
      if (point.kind == ComputeProfile::Point::kNeedParameters) {
        PS_RETURN_IF_ERROR(hooks->BeforeForward(point.begin, point.end));
      } else if (point.kind == ComputeProfile::Point::kGradientsEarly) {
        hooks->GradientsReady(point.begin, point.end);
      } else if (point.kind == ComputeProfile::Point::kGradientsReady) {
        hooks->AfterBackward(point.begin, point.end);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace ps::worker
