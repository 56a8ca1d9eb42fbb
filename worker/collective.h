#ifndef PS_WORKER_COLLECTIVE_H_
#define PS_WORKER_COLLECTIVE_H_

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/device.h"
#include "common/tensor.h"

namespace ps::worker {

// Collectives between the D replicas of one worker, over equally sized fp32
// buffers, one per device, buffers[d] on device d. Buffers[0] is the root: it
// is the one copied to and from the host, so the host link carries one
// model's worth per step whatever D is.
//
// Implementations: CPU devices (a parallel reduction in host memory, each
// device's thread summing one slice) and CUDA devices (NcclCollective:
// kernels between logical devices of one GPU, NCCL across GPUs).
// Calls are issued from one thread; on CUDA they are queued on the devices'
// streams.
class DeviceCollective {
 public:
  virtual ~DeviceCollective() = default;

  // buffers[0] = sum over d of buffers[d]. Other buffers become undefined.
  virtual absl::Status ReduceSumToRoot(const std::vector<Tensor*>& buffers) = 0;
  // buffers[d] = buffers[0] for every d.
  virtual absl::Status BroadcastFromRoot(const std::vector<Tensor*>& buffers) = 0;

  // The collective for `devices` (all of one type). kUnimplemented for
  // several CUDA devices in a build without CUDA; kInvalidArgument for a mix
  // of device types.
  static absl::StatusOr<std::unique_ptr<DeviceCollective>> Create(
      const std::vector<Device*>& devices);
};

}  // namespace ps::worker

#endif  // PS_WORKER_COLLECTIVE_H_
