#include "kernels/elementwise.h"

#include "kernels/dispatch.h"
#include "kernels/elementwise_cpu.h"

#ifdef PS_WITH_CUDA
#include "kernels/elementwise_cuda.h"
#endif

namespace ps::kernels {

absl::Status Fill(Device& device, int64_t n, float value, float* y) {
  if (device.is_cpu()) {
    internal::FillCpu(AsCpu(device), n, value, y);
    return absl::OkStatus();
  }
  PS_LAUNCH_CUDA(device, "Fill", internal::FillCuda(stream, n, value, y));
}

absl::Status Scale(Device& device, int64_t n, float alpha, float* y) {
  if (device.is_cpu()) {
    internal::ScaleCpu(AsCpu(device), n, alpha, y);
    return absl::OkStatus();
  }
  PS_LAUNCH_CUDA(device, "Scale", internal::ScaleCuda(stream, n, alpha, y));
}

absl::Status Axpy(Device& device, int64_t n, float alpha, const float* x, float* y) {
  if (device.is_cpu()) {
    internal::AxpyCpu(AsCpu(device), n, alpha, x, y);
    return absl::OkStatus();
  }
  PS_LAUNCH_CUDA(device, "Axpy", internal::AxpyCuda(stream, n, alpha, x, y));
}

absl::Status Add(Device& device, int64_t n, const float* a, const float* b, float* out) {
  if (device.is_cpu()) {
    internal::AddCpu(AsCpu(device), n, a, b, out);
    return absl::OkStatus();
  }
  PS_LAUNCH_CUDA(device, "Add", internal::AddCuda(stream, n, a, b, out));
}

}  // namespace ps::kernels
