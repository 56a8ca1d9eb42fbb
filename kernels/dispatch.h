#ifndef PS_KERNELS_DISPATCH_H_
#define PS_KERNELS_DISPATCH_H_

// How a kernel's public entry point picks its CPU or CUDA implementation.
//
//   absl::Status Axpy(Device& device, int64_t n, ...) {
//     if (device.is_cpu()) {
//       internal::AxpyCpu(AsCpu(device), n, ...);
//       return absl::OkStatus();
//     }
//     PS_LAUNCH_CUDA(device, "Axpy", internal::AxpyCuda(stream, n, ...));
//   }
//
// PS_LAUNCH_CUDA makes the device's GPU current, evaluates the launcher with
// `stream` bound to the device's stream, and returns the launch status. In a
// build without CUDA it returns kUnimplemented and the launcher expression is
// not compiled: there is no silent CPU fallback.

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/cpu_device.h"
#include "common/device.h"

#ifdef PS_WITH_CUDA
#include "common/cuda_check.h"
#include "common/cuda_device.h"

#define PS_LAUNCH_CUDA(device, what, launch)                        \
  do {                                                              \
    ::ps::CudaDevice& ps_cuda_device_ = ::ps::AsCuda(device);       \
    ::absl::Status ps_current_ = ps_cuda_device_.MakeCurrent();     \
    if (!ps_current_.ok()) return ps_current_;                      \
    [[maybe_unused]] cudaStream_t stream = ps_cuda_device_.stream(); \
    return ::ps::CudaStatus((launch), what);                        \
  } while (false)
#else
#define PS_LAUNCH_CUDA(device, what, launch)                                     \
  do {                                                                           \
    (void)(device);                                                              \
    return ::absl::UnimplementedError(                                           \
        ::absl::StrCat(what, ": CUDA device in a build without CUDA support"));  \
  } while (false)
#endif

#endif  // PS_KERNELS_DISPATCH_H_
