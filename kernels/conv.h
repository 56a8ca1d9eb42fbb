#ifndef PS_KERNELS_CONV_H_
#define PS_KERNELS_CONV_H_

// 2-D convolution (cross-correlation, as PyTorch's Conv2d), NCHW activations
// and OIHW weights, with stride and zero padding; no dilation or groups.

#include <cstdint>

#include "absl/status/status.h"
#include "common/device.h"
#include "kernels/activation_pool.h"
#include "kernels/pool.h"

namespace ps::kernels {

struct Conv2dShape {
  int64_t batch = 1;
  int64_t in_channels = 1;
  int64_t height = 1;  // input
  int64_t width = 1;
  int64_t out_channels = 1;
  int64_t kernel_h = 1;
  int64_t kernel_w = 1;
  int64_t stride_h = 1;
  int64_t stride_w = 1;
  int64_t pad_h = 0;
  int64_t pad_w = 0;

  int64_t out_height() const { return (height + 2 * pad_h - kernel_h) / stride_h + 1; }
  int64_t out_width() const { return (width + 2 * pad_w - kernel_w) / stride_w + 1; }
};

// kInvalidArgument naming the bad field when a size is non-positive, a pad is
// negative, or the output would be empty.
absl::Status ValidateConv2dShape(const Conv2dShape& shape);

// x [N, C, H, W], weight [O, C, KH, KW], bias [O] (may be null) ->
// y [N, O, OH, OW]. Uses device scratch slots 0 and 1.
absl::Status Conv2dForward(Device& device, const Conv2dShape& shape, const float* x,
                           const float* weight, const float* bias, float* y);

// Given dy [N, O, OH, OW]: dx (skipped when null), dweight and dbias (skipped
// when null), all overwritten. Uses device scratch slots 0 and 1.
absl::Status Conv2dBackward(Device& device, const Conv2dShape& shape, const float* x,
                            const float* weight, const float* dy, float* dx, float* dweight,
                            float* dbias);

// Convolution with an activation and 2-D pooling fused on:
// a = act(conv(x) + bias) [N, O, OH, OW] and y = pool(a) (average, or max
// with argmax as in MaxPool2dForward), as Conv2dForward followed by
// activation_pool.h's kernels and with the same results, but on the CPU each
// output block is activated and pooled while it is in cache, so the
// pre-activation output is never written. `pool` describes pooling over the
// convolution's output ([N, O, OH, OW]); kInvalidArgument when it does not
// match or is invalid. argmax only for max pooling (else may be null).
struct ConvActivationPool {
  PoolActivation activation = PoolActivation::kSigmoid;
  bool max = false;  // max pooling, else average
  Pool2dShape pool;
};
absl::Status Conv2dActivationPoolForward(Device& device, const Conv2dShape& shape,
                                         const ConvActivationPool& epilogue, const float* x,
                                         const float* weight, const float* bias, float* a,
                                         float* y, int32_t* argmax);

// The backward pass of the above from the pooled gradient dy
// ([N, O, pooled OH, pooled OW]), the forward's a and argmax: dx (skipped
// when null), dweight and dbias (skipped when null), all overwritten. On the
// CPU the convolution's dy is computed block by block in cache and never
// stored; on CUDA it goes through device scratch slot 2. Also uses slots 0
// and 1.
absl::Status Conv2dActivationPoolBackward(Device& device, const Conv2dShape& shape,
                                          const ConvActivationPool& epilogue, const float* x,
                                          const float* weight, const float* a, const float* dy,
                                          const int32_t* argmax, float* dx, float* dweight,
                                          float* dbias);

}  // namespace ps::kernels

#endif  // PS_KERNELS_CONV_H_
