#include "kernels/pool.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/dispatch.h"
#include "kernels/pool_cpu.h"

#ifdef PS_WITH_CUDA
#include "kernels/pool_cuda.h"
#include "kernels/pool_dims.h"
#endif

namespace ps::kernels {
namespace {

absl::Status Invalid(absl::string_view field, int64_t value, absl::string_view requirement) {
  return absl::InvalidArgumentError(
      absl::StrCat("Pool2dShape.", field, " = ", value, ": ", requirement));
}

}  // namespace

absl::Status ValidatePool2dShape(const Pool2dShape& s) {
  constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
  if (s.batch < 0) return Invalid("batch", s.batch, "must be >= 0");
  if (s.channels < 1) return Invalid("channels", s.channels, "must be >= 1");
  if (s.height < 1 || s.height > kInt32Max) {
    return Invalid("height", s.height, "out of range [1, 2^31)");
  }
  if (s.width < 1 || s.width > kInt32Max) {
    return Invalid("width", s.width, "out of range [1, 2^31)");
  }
  // argmax holds an int32 index within one input plane.
  if (s.height * s.width > kInt32Max) {
    return Invalid("height * width", s.height * s.width, "must fit in int32 (argmax)");
  }
  // Upper bounds keep height + 2 * pad from overflowing.
  if (s.kernel_h < 1 || s.kernel_h > kInt32Max) {
    return Invalid("kernel_h", s.kernel_h, "out of range [1, 2^31)");
  }
  if (s.kernel_w < 1 || s.kernel_w > kInt32Max) {
    return Invalid("kernel_w", s.kernel_w, "out of range [1, 2^31)");
  }
  if (s.stride_h < 1 || s.stride_h > kInt32Max) {
    return Invalid("stride_h", s.stride_h, "out of range [1, 2^31)");
  }
  if (s.stride_w < 1 || s.stride_w > kInt32Max) {
    return Invalid("stride_w", s.stride_w, "out of range [1, 2^31)");
  }
  // PyTorch's rule; it also guarantees every window holds at least one real
  // (unpadded) cell, which max pooling relies on.
  if (s.pad_h < 0 || s.pad_h > s.kernel_h / 2) {
    return Invalid("pad_h", s.pad_h,
                   absl::StrCat("must be in [0, kernel_h / 2 = ", s.kernel_h / 2, "]"));
  }
  if (s.pad_w < 0 || s.pad_w > s.kernel_w / 2) {
    return Invalid("pad_w", s.pad_w,
                   absl::StrCat("must be in [0, kernel_w / 2 = ", s.kernel_w / 2, "]"));
  }
  if (s.kernel_h > s.height + 2 * s.pad_h) {
    return Invalid("kernel_h", s.kernel_h, "larger than the padded height");
  }
  if (s.kernel_w > s.width + 2 * s.pad_w) {
    return Invalid("kernel_w", s.kernel_w, "larger than the padded width");
  }
  if (s.channels >
      std::numeric_limits<int64_t>::max() / (s.height * s.width) / std::max<int64_t>(1, s.batch)) {
    return Invalid("channels", s.channels, "batch * channels * height * width overflows");
  }
  return absl::OkStatus();
}

absl::Status MaxPool2dForward(Device& device, const Pool2dShape& shape, const float* x, float* y,
                              int32_t* argmax) {
  PS_RETURN_IF_ERROR(ValidatePool2dShape(shape));
  if (device.is_cpu()) {
    internal::MaxPool2dForwardCpu(AsCpu(device), shape, x, y, argmax);
    return absl::OkStatus();
  }
  PS_LAUNCH_CUDA(device, "MaxPool2dForward",
                 internal::MaxPool2dForwardCuda(stream, internal::ToPoolDims(shape), x, y, argmax));
}

absl::Status MaxPool2dBackward(Device& device, const Pool2dShape& shape, const float* dy,
                               const int32_t* argmax, float* dx) {
  PS_RETURN_IF_ERROR(ValidatePool2dShape(shape));
  if (device.is_cpu()) {
    internal::MaxPool2dBackwardCpu(AsCpu(device), shape, dy, argmax, dx);
    return absl::OkStatus();
  }
  PS_LAUNCH_CUDA(device, "MaxPool2dBackward",
                 internal::MaxPool2dBackwardCuda(stream, internal::ToPoolDims(shape), dy, argmax, dx));
}

absl::Status AvgPool2dForward(Device& device, const Pool2dShape& shape, const float* x, float* y) {
  PS_RETURN_IF_ERROR(ValidatePool2dShape(shape));
  if (device.is_cpu()) {
    internal::AvgPool2dForwardCpu(AsCpu(device), shape, x, y);
    return absl::OkStatus();
  }
  PS_LAUNCH_CUDA(device, "AvgPool2dForward",
                 internal::AvgPool2dForwardCuda(stream, internal::ToPoolDims(shape), x, y));
}

absl::Status AvgPool2dBackward(Device& device, const Pool2dShape& shape, const float* dy,
                               float* dx) {
  PS_RETURN_IF_ERROR(ValidatePool2dShape(shape));
  if (device.is_cpu()) {
    internal::AvgPool2dBackwardCpu(AsCpu(device), shape, dy, dx);
    return absl::OkStatus();
  }
  PS_LAUNCH_CUDA(device, "AvgPool2dBackward",
                 internal::AvgPool2dBackwardCuda(stream, internal::ToPoolDims(shape), dy, dx));
}

}  // namespace ps::kernels
