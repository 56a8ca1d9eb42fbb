#include "worker/nccl_collective.h"

#ifdef PS_WITH_CUDA

#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cuda_check.h"
#include "common/status_macros.h"
#include "kernels/elementwise.h"

namespace ps::worker {

absl::StatusOr<std::unique_ptr<NcclCollective>> NcclCollective::Create(
    const std::vector<Device*>& devices) {
  if (devices.empty()) return absl::InvalidArgumentError("NCCL collective: no devices");
  std::vector<CudaDevice*> cuda;
  std::set<Device*> seen;
  for (Device* d : devices) {
    if (d == nullptr) return absl::InvalidArgumentError("NCCL collective: null device");
    if (!d->is_cuda()) {
      return absl::InvalidArgumentError(
          absl::StrCat("NCCL collective: ", d->name(), " is not a CUDA device"));
    }
    if (!seen.insert(d).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("NCCL collective: ", d->name(), " is listed twice"));
    }
    cuda.push_back(&AsCuda(*d));
  }
  std::unique_ptr<NcclCollective> collective(new NcclCollective(std::move(cuda)));
  PS_RETURN_IF_ERROR(collective->Init());
  return collective;
}

NcclCollective::NcclCollective(std::vector<CudaDevice*> devices)
    : devices_(std::move(devices)), events_(devices_.size(), nullptr) {}

absl::Status NcclCollective::Init() {
  // Group the logical devices by GPU, groups in order of their first device.
  std::map<int, int> group_of_gpu;
  for (int d = 0; d < static_cast<int>(devices_.size()); ++d) {
    const int gpu = devices_[d]->gpu_id();
    auto [it, added] = group_of_gpu.emplace(gpu, static_cast<int>(groups_.size()));
    if (added) {
      groups_.emplace_back();
      groups_.back().gpu_id = gpu;
    }
    groups_[it->second].members.push_back(d);
  }

  // Events only order streams; no timing.
  for (size_t d = 0; d < devices_.size(); ++d) {
    PS_RETURN_IF_ERROR(devices_[d]->MakeCurrent());
    PS_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&events_[d], cudaEventDisableTiming));
  }

  if (groups_.size() > 1) {
    const std::vector<int> gpus = gpu_ids();
    std::vector<ncclComm_t> comms(gpus.size(), nullptr);
    PS_NCCL_RETURN_IF_ERROR(
        ncclCommInitAll(comms.data(), static_cast<int>(gpus.size()), gpus.data()));
    comms_ = std::move(comms);
  }
  return absl::OkStatus();
}

NcclCollective::~NcclCollective() {
  // A communicator must not go while collectives queued on it still run.
  for (CudaDevice* device : devices_) (void)device->Synchronize();
  for (ncclComm_t comm : comms_) {
    if (comm != nullptr) ncclCommDestroy(comm);
  }
  for (size_t d = 0; d < devices_.size(); ++d) {
    if (events_[d] == nullptr) continue;
    (void)devices_[d]->MakeCurrent();
    cudaEventDestroy(events_[d]);
  }
}

std::vector<int> NcclCollective::gpu_ids() const {
  std::vector<int> ids;
  for (const Group& g : groups_) ids.push_back(g.gpu_id);
  return ids;
}

absl::Status NcclCollective::CheckBuffers(const std::vector<Tensor*>& buffers) const {
  if (buffers.size() != devices_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(buffers.size(), " buffers for ", devices_.size(), " devices"));
  }
  for (size_t d = 0; d < buffers.size(); ++d) {
    const Tensor* t = buffers[d];
    if (t == nullptr || t->dtype() != DType::kF32 ||
        t->num_elements() != buffers[0]->num_elements()) {
      return absl::InvalidArgumentError("collective buffers differ in size or are not F32");
    }
    if (t->device() != devices_[d]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "collective buffer ", d, " is on ", t->device() ? t->device()->name() : "no device",
          ", not on ", devices_[d]->name()));
    }
  }
  return absl::OkStatus();
}

absl::Status NcclCollective::Record(int d) {
  PS_RETURN_IF_ERROR(devices_[d]->MakeCurrent());
  PS_CUDA_RETURN_IF_ERROR(cudaEventRecord(events_[d], devices_[d]->stream()));
  return absl::OkStatus();
}

absl::Status NcclCollective::Wait(int waiter, int producer) {
  PS_RETURN_IF_ERROR(devices_[waiter]->MakeCurrent());
  PS_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(devices_[waiter]->stream(), events_[producer], 0));
  return absl::OkStatus();
}

template <typename Op>
absl::Status NcclCollective::ForEachRankGrouped(const char* what, const Op& op) {
  // One thread drives every GPU, so the per-rank calls must form one NCCL
  // group: outside a group the first call could block waiting for the others.
  PS_NCCL_RETURN_IF_ERROR(ncclGroupStart());
  absl::Status status;
  for (size_t g = 0; g < groups_.size() && status.ok(); ++g) {
    CudaDevice& leader = *devices_[groups_[g].members[0]];
    status = leader.MakeCurrent();
    if (status.ok()) status = NcclStatus(op(static_cast<int>(g), comms_[g], leader.stream()), what);
  }
  const absl::Status end = NcclStatus(ncclGroupEnd(), "ncclGroupEnd");
  return status.ok() ? end : status;
}

absl::Status NcclCollective::ReduceSumToRoot(const std::vector<Tensor*>& buffers) {
  PS_RETURN_IF_ERROR(CheckBuffers(buffers));
  const int64_t n = buffers[0]->num_elements();
  if (n == 0 || devices_.size() == 1) return absl::OkStatus();

  // 1. Within each GPU: the leader adds its members' buffers into its own,
  //    each after the member's queued work (its backward pass).
  for (const Group& g : groups_) {
    const int leader = g.members[0];
    float* sum = buffers[leader]->mutable_data<float>();
    for (size_t i = 1; i < g.members.size(); ++i) {
      const int member = g.members[i];
      PS_RETURN_IF_ERROR(Record(member));
      PS_RETURN_IF_ERROR(Wait(leader, member));
      PS_RETURN_IF_ERROR(
          kernels::Add(*devices_[leader], n, sum, buffers[member]->data<float>(), sum));
    }
  }

  // 2. Across GPUs: the leaders' partial sums into device 0 (rank 0).
  if (uses_nccl()) {
    PS_RETURN_IF_ERROR(
        ForEachRankGrouped("ncclReduce", [&](int g, ncclComm_t comm, cudaStream_t stream) {
          float* partial = buffers[groups_[g].members[0]]->mutable_data<float>();
          return ncclReduce(partial, partial, static_cast<size_t>(n), ncclFloat, ncclSum,
                            /*root=*/0, comm, stream);
        }));
  }

  // 3. A member's later writes to its buffer wait for the leader's reads.
  for (const Group& g : groups_) {
    if (g.members.size() < 2) continue;
    PS_RETURN_IF_ERROR(Record(g.members[0]));
    for (size_t i = 1; i < g.members.size(); ++i) {
      PS_RETURN_IF_ERROR(Wait(g.members[i], g.members[0]));
    }
  }
  return absl::OkStatus();
}

absl::Status NcclCollective::BroadcastFromRoot(const std::vector<Tensor*>& buffers) {
  PS_RETURN_IF_ERROR(CheckBuffers(buffers));
  const int64_t n = buffers[0]->num_elements();
  if (n == 0 || devices_.size() == 1) return absl::OkStatus();

  // 1. Across GPUs: device 0's buffer to every other GPU's leader.
  if (uses_nccl()) {
    PS_RETURN_IF_ERROR(ForEachRankGrouped("ncclBroadcast", [&](int g, ncclComm_t comm,
                                                               cudaStream_t stream) {
      float* data = buffers[groups_[g].members[0]]->mutable_data<float>();
      return ncclBroadcast(data, data, static_cast<size_t>(n), ncclFloat, /*root=*/0, comm, stream);
    }));
  }

  // 2. Within each GPU: every member copies its leader's buffer once the
  //    leader holds the data.
  const int64_t bytes = buffers[0]->num_bytes();
  for (const Group& g : groups_) {
    if (g.members.size() < 2) continue;
    const int leader = g.members[0];
    PS_RETURN_IF_ERROR(Record(leader));
    for (size_t i = 1; i < g.members.size(); ++i) {
      const int member = g.members[i];
      PS_RETURN_IF_ERROR(Wait(member, leader));
      PS_RETURN_IF_ERROR(devices_[member]->CopyOnDevice(buffers[member]->mutable_raw_data(),
                                                        buffers[leader]->raw_data(), bytes));
    }
  }

  // 3. The leader's later writes to its buffer wait for the members' copies.
  for (const Group& g : groups_) {
    for (size_t i = 1; i < g.members.size(); ++i) {
      PS_RETURN_IF_ERROR(Record(g.members[i]));
      PS_RETURN_IF_ERROR(Wait(g.members[0], g.members[i]));
    }
  }
  return absl::OkStatus();
}

}  // namespace ps::worker

#endif  // PS_WITH_CUDA
