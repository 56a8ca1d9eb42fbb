#include "kernels/activation.h"

#include "absl/strings/str_cat.h"
#include "kernels/activation_cpu.h"
#include "kernels/dispatch.h"

#ifdef PS_WITH_CUDA
#include "kernels/activation_cuda.h"
#endif

namespace ps::kernels {
namespace {

absl::Status ValidateCount(const char* what, int64_t n) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat(what, ": n = ", n, " < 0"));
  return absl::OkStatus();
}

}  // namespace

absl::Status ReluForward(Device& device, int64_t n, const float* x, float* y) {
  if (absl::Status s = ValidateCount("ReluForward", n); !s.ok()) return s;
  if (device.is_cpu()) {
    internal::ReluForwardCpu(AsCpu(device), n, x, y);
    return absl::OkStatus();
  }
  PS_LAUNCH_CUDA(device, "ReluForward", internal::ReluForwardCuda(stream, n, x, y));
}

absl::Status ReluBackward(Device& device, int64_t n, const float* y, const float* dy, float* dx) {
  if (absl::Status s = ValidateCount("ReluBackward", n); !s.ok()) return s;
  if (device.is_cpu()) {
    internal::ReluBackwardCpu(AsCpu(device), n, y, dy, dx);
    return absl::OkStatus();
  }
  PS_LAUNCH_CUDA(device, "ReluBackward", internal::ReluBackwardCuda(stream, n, y, dy, dx));
}

absl::Status SigmoidForward(Device& device, int64_t n, const float* x, float* y) {
  if (absl::Status s = ValidateCount("SigmoidForward", n); !s.ok()) return s;
  if (device.is_cpu()) {
    internal::SigmoidForwardCpu(AsCpu(device), n, x, y);
    return absl::OkStatus();
  }
  PS_LAUNCH_CUDA(device, "SigmoidForward", internal::SigmoidForwardCuda(stream, n, x, y));
}

absl::Status SigmoidBackward(Device& device, int64_t n, const float* y, const float* dy,
                             float* dx) {
  if (absl::Status s = ValidateCount("SigmoidBackward", n); !s.ok()) return s;
  if (device.is_cpu()) {
    internal::SigmoidBackwardCpu(AsCpu(device), n, y, dy, dx);
    return absl::OkStatus();
  }
  PS_LAUNCH_CUDA(device, "SigmoidBackward", internal::SigmoidBackwardCuda(stream, n, y, dy, dx));
}

}  // namespace ps::kernels
