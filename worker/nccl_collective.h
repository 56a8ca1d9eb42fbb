#ifndef PS_WORKER_NCCL_COLLECTIVE_H_
#define PS_WORKER_NCCL_COLLECTIVE_H_

// The DeviceCollective for CUDA devices. Built only with PS_WITH_CUDA (the
// "collective" target in worker/BUILD leaves it out under --config=cpu_only);
// callers reach it through DeviceCollective::Create.

#ifdef PS_WITH_CUDA

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/cuda_device.h"
#include "common/device.h"
#include "common/tensor.h"
#include "worker/collective.h"

namespace ps::worker {

// Sums and broadcasts over D logical CUDA devices, several of which may share
// one physical GPU (each with its own stream).
//
// NCCL cannot place two ranks of one communicator on the same GPU, so the
// devices are grouped by gpu_id. A group's leader is its lowest-index device;
// device 0 leads its group, and its GPU is NCCL rank 0. There is one NCCL
// communicator per GPU (ncclCommInitAll), and none at all when every device
// is on one GPU.
//
// ReduceSumToRoot:
//   1. in each group, the leader's stream adds every other member's buffer
//      into the leader's (kernels::Add, members in index order), each Add
//      waiting on an event recorded on that member's stream;
//   2. across GPUs, one grouped ncclReduce(sum) of the leaders' partial sums
//      into device 0's buffer;
//   3. each member's stream waits for its leader's work, so the member's later
//      writes to its buffer cannot overtake the leader's reads.
// BroadcastFromRoot:
//   1. across GPUs, one grouped ncclBroadcast from device 0 to the leaders;
//   2. in each group, every member's stream waits for its leader, then copies
//      the leader's buffer device-to-device;
//   3. each leader's stream waits for its members' copies, so the leader's
//      later writes cannot overtake them.
// So with D devices on one GPU the sum is ((b0 + b1) + b2) + ..., the order of
// the CPU collective; across GPUs the order is NCCL's.
//
// Blocking: neither call waits for the devices. Each returns once the work is
// queued on the devices' streams, ordered after everything queued earlier on
// every participating device and before anything queued later; Synchronize a
// device (or copy from it to the host) to wait for its part. The host never
// waits on one device while issuing work to another.
//
// Thread safety: one thread issues the calls, while no other thread issues
// work to these devices (the Trainer's pattern). The calls change the
// calling thread's current CUDA device.
//
// Errors: kInvalidArgument when the buffers are not one F32 tensor of equal
// size per device, buffers[d] on device d; kInternal when a CUDA or NCCL call
// fails (the message names the call).
class NcclCollective final : public DeviceCollective {
 public:
  // `devices` are CUDA devices (kInvalidArgument otherwise), not null, each
  // listed once, and must outlive the collective. Creates one event per
  // device and, when they span several GPUs, the NCCL communicators (which
  // takes a while: call once, not per step).
  static absl::StatusOr<std::unique_ptr<NcclCollective>> Create(
      const std::vector<Device*>& devices);
  // Waits for the devices' queued work, then destroys the communicators and
  // events.
  ~NcclCollective() override;

  NcclCollective(const NcclCollective&) = delete;
  NcclCollective& operator=(const NcclCollective&) = delete;

  absl::Status ReduceSumToRoot(const std::vector<Tensor*>& buffers) override;
  absl::Status BroadcastFromRoot(const std::vector<Tensor*>& buffers) override;

  // The physical GPUs the devices span, in NCCL rank order (device 0's first).
  std::vector<int> gpu_ids() const;
  // Whether the devices span more than one GPU, so that NCCL carries data.
  bool uses_nccl() const { return !comms_.empty(); }

 private:
  // The logical devices on one physical GPU, by index, ascending; members[0]
  // is the leader.
  struct Group {
    int gpu_id = -1;
    std::vector<int> members;
  };

  explicit NcclCollective(std::vector<CudaDevice*> devices);
  absl::Status Init();
  absl::Status CheckBuffers(const std::vector<Tensor*>& buffers) const;

  // Records device d's event after the work queued so far on its stream.
  absl::Status Record(int d);
  // Makes device `waiter`'s stream wait for device `producer`'s last Record.
  absl::Status Wait(int waiter, int producer);

  // Issues op(group index, communicator, leader's stream) for every group
  // between ncclGroupStart and ncclGroupEnd; the group is closed even when a
  // call fails.
  template <typename Op>
  absl::Status ForEachRankGrouped(const char* what, const Op& op);

  std::vector<CudaDevice*> devices_;
  std::vector<cudaEvent_t> events_;  // events_[d] on device d's GPU
  std::vector<Group> groups_;        // groups_[0] holds device 0
  std::vector<ncclComm_t> comms_;    // comms_[g]: rank g, on groups_[g]'s GPU
};

}  // namespace ps::worker

#endif  // PS_WITH_CUDA

#endif  // PS_WORKER_NCCL_COLLECTIVE_H_
