#ifndef PS_KERNELS_POOL_H_
#define PS_KERNELS_POOL_H_

// 2-D max and average pooling over NCHW activations, PyTorch semantics:
// floor output size, zero padding; average pooling counts padded cells
// (count_include_pad=True); max pooling ignores them.

#include <cstdint>

#include "absl/status/status.h"
#include "common/device.h"

namespace ps::kernels {

struct Pool2dShape {
  int64_t batch = 1;
  int64_t channels = 1;
  int64_t height = 1;
  int64_t width = 1;
  int64_t kernel_h = 2;
  int64_t kernel_w = 2;
  int64_t stride_h = 2;
  int64_t stride_w = 2;
  int64_t pad_h = 0;
  int64_t pad_w = 0;

  int64_t out_height() const { return (height + 2 * pad_h - kernel_h) / stride_h + 1; }
  int64_t out_width() const { return (width + 2 * pad_w - kernel_w) / stride_w + 1; }
};

// kInvalidArgument naming the bad field (pad must be <= kernel / 2, as in PyTorch).
absl::Status ValidatePool2dShape(const Pool2dShape& shape);

// x [N, C, H, W] -> y [N, C, OH, OW]; argmax [N, C, OH, OW] receives the
// index (h * W + w) within its input plane of each output's maximum.
absl::Status MaxPool2dForward(Device& device, const Pool2dShape& shape, const float* x, float* y,
                              int32_t* argmax);
// dx (overwritten) from dy and the forward pass's argmax.
absl::Status MaxPool2dBackward(Device& device, const Pool2dShape& shape, const float* dy,
                               const int32_t* argmax, float* dx);

absl::Status AvgPool2dForward(Device& device, const Pool2dShape& shape, const float* x, float* y);
// dx (overwritten) from dy.
absl::Status AvgPool2dBackward(Device& device, const Pool2dShape& shape, const float* dy,
                               float* dx);

}  // namespace ps::kernels

#endif  // PS_KERNELS_POOL_H_
