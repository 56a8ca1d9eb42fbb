#include "worker/compute_mode_real.h"

#include "common/status_macros.h"
#include "common/timed_event.h"
#include "kernels/elementwise.h"

namespace ps::worker {

absl::Status AccumulateMetrics(Device& device, const model::DeviceMetrics& metrics, Tensor& acc) {
  float* sums = acc.mutable_data<float>();
  PS_RETURN_IF_ERROR(kernels::Axpy(device, 1, 1.f, metrics.loss_sum, sums));
  return kernels::Axpy(device, 1, 1.f, metrics.correct, sums + 1);
}

absl::Status RealCompute::Compute(ComputeStep& step) {
  const int d_count = static_cast<int>(step.shards.size());
  auto run_replica = [&](int d) -> absl::Status {
    ScopedEvent event(step.observer, clock_, EventKind::kCompute, DeviceLane(d), step.iteration);
    DeviceShard& shard = step.shards[d];
    model::Model& model = *shard.model;
    model.set_step(step.iteration);
    if (shard.size == 0) {
      // An empty shard contributes a zero gradient (its parameters are
      // whole: the last step drained, as a replica without hooks needs).
      if (!step.overlap.empty()) PS_RETURN_IF_ERROR(step.await_all_parameters());
      return model.flat_gradients().SetZero();
    }
    if (!step.overlap.empty()) model.set_parameter_hooks(step.overlap[d]);
    absl::StatusOr<model::DeviceMetrics> metrics = model.ForwardBackward(shard.inputs, shard.labels);
    model.set_parameter_hooks(nullptr);
    PS_RETURN_IF_ERROR(metrics.status());
    if (shard.metrics != nullptr) {
      PS_RETURN_IF_ERROR(AccumulateMetrics(*shard.device, *metrics, *shard.metrics));
    }
    // Only to attribute time to compute and reduction separately (the
    // reduction would wait for the backward passes anyway), and so that the
    // device lane's event ends when the device's work does.
    if (d_count > 1) PS_RETURN_IF_ERROR(shard.device->Synchronize());
    return absl::OkStatus();
  };
  return step.device_threads->RunOnAll(run_replica);
}

}  // namespace ps::worker
