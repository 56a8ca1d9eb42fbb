#ifndef PS_COMMON_DEVICES_H_
#define PS_COMMON_DEVICES_H_

// The devices a process trains on: parsing `--devices` and creating them.
// Links the CUDA runtime when the build has CUDA; code that only needs the
// Device interface or CPU devices (the parameter server) depends on
// //common:device_interface or //common:cpu_device instead.

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/device.h"

namespace ps {

// What `--devices` asks for.
struct DeviceSpec {
  DeviceType type = DeviceType::kCpu;
  // CPU: the number of devices. CUDA: ignored when gpu_ids is set.
  int count = 1;
  // CUDA: physical GPU ids, one logical device each; repeats allowed (two
  // logical devices with their own streams on one GPU). Empty = all GPUs.
  std::vector<int> gpu_ids;
  bool auto_select = false;  // "auto": every GPU if any, else one CPU device
};

// Parses "auto", "cpu", "cpu:N", "cuda", "cuda:0,1,1". kInvalidArgument names
// the bad text.
absl::StatusOr<DeviceSpec> ParseDeviceSpec(absl::string_view text);

// Number of usable CUDA GPUs: 0 when the build has no CUDA, there is no
// driver, or no GPU. Never fails.
int CudaGpuCount();

// Creates the devices `spec` names. CPU devices split `cpu_threads` (0 = all
// hardware threads) between them, at least one each. kUnavailable when CUDA
// is asked for and none is usable; kUnimplemented in a build without CUDA.
absl::StatusOr<std::vector<std::unique_ptr<Device>>> CreateDevices(const DeviceSpec& spec,
                                                                   int cpu_threads = 0);

}  // namespace ps

#endif  // PS_COMMON_DEVICES_H_
