#ifndef PS_WORKER_COMPUTE_MODE_REAL_H_
#define PS_WORKER_COMPUTE_MODE_REAL_H_

#include <string>

#include "absl/status/status.h"
#include "common/clock.h"
#include "common/device.h"
#include "common/tensor.h"
#include "worker/compute_mode.h"
#include "worker/model/model.h"

namespace ps::worker {

// The real thing (the default): every device's replica runs forward/backward
// on its shard at once, each on its device's thread, and adds its loss and
// correct count to its shard's metrics. Overlapping, replica 0's forward
// waits layer by layer for the previous step's pulls through step.overlap,
// and its backward hands its gradients over layer by layer. An empty shard
// contributes a zero gradient.
class RealCompute final : public ComputeMode {
 public:
  // `clock` times the device-lane events; it must outlive this object.
  explicit RealCompute(const Clock* clock) : clock_(clock) {}

  std::string Name() const override { return "real"; }
  absl::Status Compute(ComputeStep& step) override;

 private:
  const Clock* const clock_;
};

// acc[0] += loss sum, acc[1] += correct count, on the device (queued, like
// the metrics). `acc` is a [2] tensor on `device`.
absl::Status AccumulateMetrics(Device& device, const model::DeviceMetrics& metrics, Tensor& acc);

}  // namespace ps::worker

#endif  // PS_WORKER_COMPUTE_MODE_REAL_H_
