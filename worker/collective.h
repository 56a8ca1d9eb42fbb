#ifndef PS_WORKER_COLLECTIVE_H_
#define PS_WORKER_COLLECTIVE_H_

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/device.h"
#include "common/tensor.h"
#include "worker/device_threads.h"

namespace ps::worker {

// Collectives between the D replicas of one worker, over equally sized fp32
// buffers, one per device, buffers[d] on device d. Buffers[0] is the root: it
// is the one copied to and from the host, so the host link carries one
// model's worth per step whatever D is.
//
// Implementations: CPU devices (a parallel reduction in host memory, each
// device's long-lived thread summing one slice, so every byte is touched once
// and all devices' cores work at once) and CUDA devices (NcclCollective:
// kernels between logical devices of one GPU, NCCL across GPUs).
//
// Blocking: on CPU devices a call returns when the result is in place; on
// CUDA devices it returns once the work is queued on the devices' streams
// (see nccl_collective.h).
//
// Thread safety: one thread issues the calls, and it is not one of the
// DeviceThreads' lanes (the CPU collective runs its slices on them).
//
// Errors: kInvalidArgument when the buffers are not one F32 tensor of equal
// size per device; kInternal for a failing CUDA or NCCL call.
// root[i] += others[0][i], then += others[1][i], ... for i in [begin, end):
// the device order in which every sum of one worker's replicas' gradients
// in host memory is taken (the CPU collective's, the overlap's region by
// region), so where and when a sum runs changes no bit.
void SumInDeviceOrder(float* root, absl::Span<const float* const> others, int64_t begin,
                      int64_t end);

class DeviceCollective {
 public:
  virtual ~DeviceCollective() = default;

  // buffers[0] = sum over d of buffers[d], in device order ((b0 + b1) + b2 ...
  // on CPU devices and on logical devices of one GPU, so reruns compare bit
  // for bit). Other buffers become undefined.
  virtual absl::Status ReduceSumToRoot(const std::vector<Tensor*>& buffers) = 0;
  // buffers[d] = buffers[0] for every d.
  virtual absl::Status BroadcastFromRoot(const std::vector<Tensor*>& buffers) = 0;

  // The collective for `devices` (all of one type, each listed once; they
  // must outlive it). `threads` has one lane per device (kInvalidArgument
  // otherwise) and must outlive the collective: per-device host work (the
  // CPU collective's slices) runs on it, so no call starts a thread.
  // kUnimplemented for several CUDA devices in a build without CUDA;
  // kInvalidArgument for a mix of device types.
  static absl::StatusOr<std::unique_ptr<DeviceCollective>> Create(
      const std::vector<Device*>& devices, DeviceThreads* threads);
};

}  // namespace ps::worker

#endif  // PS_WORKER_COLLECTIVE_H_
