#include "common/devices.h"

#include <algorithm>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/cpu_device.h"
#include "common/status_macros.h"

#ifdef PS_WITH_CUDA
#include <cuda_runtime_api.h>

#include "common/cuda_device.h"
#endif

namespace ps {

absl::StatusOr<DeviceSpec> ParseDeviceSpec(absl::string_view text) {
  DeviceSpec spec;
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad device list '", text, "': ", why,
        " (expected auto, cpu, cpu:N, cuda or cuda:ID[,ID...])"));
  };
  if (text == "auto") {
    spec.auto_select = true;
    return spec;
  }
  const std::vector<absl::string_view> kind_and_ids = absl::StrSplit(text, absl::MaxSplits(':', 1));
  const absl::string_view kind = kind_and_ids[0];
  const absl::string_view rest = kind_and_ids.size() > 1 ? kind_and_ids[1] : "";
  if (kind == "cpu") {
    spec.type = DeviceType::kCpu;
    spec.count = 1;
    if (kind_and_ids.size() > 1 && (!absl::SimpleAtoi(rest, &spec.count) || spec.count < 1 ||
                                    spec.count > 256)) {
      return bad("CPU device count must be an integer in [1, 256]");
    }
    return spec;
  }
  if (kind == "cuda") {
    spec.type = DeviceType::kCuda;
    if (kind_and_ids.size() == 1) return spec;
    for (absl::string_view id_text : absl::StrSplit(rest, ',')) {
      int id;
      if (!absl::SimpleAtoi(id_text, &id) || id < 0) return bad("GPU ids must be integers >= 0");
      spec.gpu_ids.push_back(id);
    }
    spec.count = static_cast<int>(spec.gpu_ids.size());
    return spec;
  }
  return bad(absl::StrCat("unknown device kind '", kind, "'"));
}

int CudaGpuCount() {
#ifdef PS_WITH_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
#else
  return 0;
#endif
}

absl::StatusOr<std::vector<std::unique_ptr<Device>>> CreateDevices(const DeviceSpec& spec,
                                                                   int cpu_threads) {
  DeviceSpec resolved = spec;
  if (spec.auto_select) {
    resolved.type = CudaGpuCount() > 0 ? DeviceType::kCuda : DeviceType::kCpu;
    resolved.count = 1;
  }
  std::vector<std::unique_ptr<Device>> devices;
  if (resolved.type == DeviceType::kCpu) {
    if (cpu_threads <= 0) cpu_threads = std::max(1u, std::thread::hardware_concurrency());
    const int per_device = std::max(1, cpu_threads / resolved.count);
    for (int i = 0; i < resolved.count; ++i) {
      devices.push_back(std::make_unique<CpuDevice>(i, per_device));
    }
    return devices;
  }
#ifdef PS_WITH_CUDA
  const int gpus = CudaGpuCount();
  if (gpus == 0) {
    return absl::UnavailableError(
        "CUDA devices requested but no GPU is usable (no driver or no device); use --devices=cpu");
  }
  std::vector<int> ids = resolved.gpu_ids;
  if (ids.empty()) {
    for (int i = 0; i < gpus; ++i) ids.push_back(i);
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= gpus) {
      return absl::InvalidArgumentError(
          absl::StrCat("GPU id ", ids[i], " requested but only ", gpus, " GPU(s) present"));
    }
    PS_ASSIGN_OR_RETURN(std::unique_ptr<CudaDevice> device,
                        CudaDevice::Create(static_cast<int>(i), ids[i]));
    devices.push_back(std::move(device));
  }
  return devices;
#else
  return absl::UnimplementedError("this build has no CUDA support (built with --config=cpu_only)");
#endif
}

}  // namespace ps
