#include "worker/collective.h"

#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cpu_device.h"

#ifdef PS_WITH_CUDA
#include "worker/nccl_collective.h"
#endif

namespace ps::worker {

void SumInDeviceOrder(float* root, absl::Span<const float* const> others, int64_t begin,
                      int64_t end) {
  for (const float* src : others) {
    for (int64_t i = begin; i < end; ++i) root[i] += src[i];
  }
}

namespace {

absl::Status CheckBuffers(const std::vector<Tensor*>& buffers, size_t devices) {
  if (buffers.size() != devices) {
    return absl::InvalidArgumentError(
        absl::StrCat(buffers.size(), " buffers for ", devices, " devices"));
  }
  for (const Tensor* t : buffers) {
    if (t->num_elements() != buffers[0]->num_elements() || t->dtype() != DType::kF32) {
      return absl::InvalidArgumentError("collective buffers differ in size or are not F32");
    }
  }
  return absl::OkStatus();
}

// CPU devices share host memory: device d's thread sums slice d of every
// buffer into the root, so the reduction runs on all devices' cores at once
// and touches each byte once.
class CpuCollective final : public DeviceCollective {
 public:
  CpuCollective(std::vector<Device*> devices, DeviceThreads* threads)
      : devices_(std::move(devices)), threads_(threads) {}

  absl::Status ReduceSumToRoot(const std::vector<Tensor*>& buffers) override {
    if (absl::Status s = CheckBuffers(buffers, devices_.size()); !s.ok()) return s;
    const int d_count = static_cast<int>(buffers.size());
    if (d_count == 1) return absl::OkStatus();
    const int64_t n = buffers[0]->num_elements();
    float* root = buffers[0]->mutable_data<float>();
    std::vector<const float*> others;
    for (int d = 1; d < d_count; ++d) others.push_back(buffers[d]->data<float>());
    return threads_->RunOnAll([&](int slice) {
      SumInDeviceOrder(root, others, n * slice / d_count, n * (slice + 1) / d_count);
      return absl::OkStatus();
    });
  }

  absl::Status BroadcastFromRoot(const std::vector<Tensor*>& buffers) override {
    if (absl::Status s = CheckBuffers(buffers, devices_.size()); !s.ok()) return s;
    return threads_->RunOnAll([&](int d) {
      if (d > 0) {
        std::memcpy(buffers[d]->mutable_raw_data(), buffers[0]->raw_data(),
                    buffers[0]->num_bytes());
      }
      return absl::OkStatus();
    });
  }

 private:
  std::vector<Device*> devices_;
  DeviceThreads* threads_;
};

// One device: nothing to reduce or broadcast.
class SingleDeviceCollective final : public DeviceCollective {
 public:
  absl::Status ReduceSumToRoot(const std::vector<Tensor*>& buffers) override {
    return CheckBuffers(buffers, 1);
  }
  absl::Status BroadcastFromRoot(const std::vector<Tensor*>& buffers) override {
    return CheckBuffers(buffers, 1);
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceCollective>> DeviceCollective::Create(
    const std::vector<Device*>& devices, DeviceThreads* threads) {
  if (devices.empty()) return absl::InvalidArgumentError("no devices");
  if (threads == nullptr || threads->size() != static_cast<int>(devices.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("the collective needs one device thread per device (", devices.size(),
                     " devices, ", threads == nullptr ? 0 : threads->size(), " threads)"));
  }
  for (Device* d : devices) {
    if (d->type() != devices[0]->type()) {
      return absl::InvalidArgumentError(absl::StrCat("cannot mix device types (", d->name(),
                                                     " and ", devices[0]->name(), ")"));
    }
  }
  if (devices.size() == 1) return std::unique_ptr<DeviceCollective>(new SingleDeviceCollective());
  if (devices[0]->is_cpu()) {
    return std::unique_ptr<DeviceCollective>(new CpuCollective(devices, threads));
  }
#ifdef PS_WITH_CUDA
  absl::StatusOr<std::unique_ptr<NcclCollective>> nccl = NcclCollective::Create(devices);
  if (!nccl.ok()) return nccl.status();
  return std::unique_ptr<DeviceCollective>(std::move(nccl).value());
#else
  return absl::UnimplementedError(
      "several CUDA devices in one worker need the NCCL collective, which this build does not "
      "have (built without CUDA); use one device per worker or a CUDA build");
#endif
}

}  // namespace ps::worker
