#ifndef PS_KERNELS_ACTIVATION_POOL_H_
#define PS_KERNELS_ACTIVATION_POOL_H_

// An element-wise activation followed by 2-D pooling (pool(act(x))), fused:
// one pass forward reads x and writes the activation a = act(x) (all the
// backward pass needs) and the pooled output, with each plane pooled while
// it is still in L1; one pass backward spreads the pooled gradient and
// applies the activation's derivative from a. For LeNet's sigmoid + 2x2
// average pool this replaces the separate activation and pool passes (and
// their full-size intermediate gradient). The activation is stored rather
// than recomputed in backward because sigmoid is compute-bound on a CPU:
// recomputing it cost more than the memory pass it saved.
//
// Same semantics and, on the CPU, bit-identical results to the activation of
// activation.h followed by the pooling of pool.h (same formulas, same
// summation order). Shapes as in pool.h; the activation sees only real cells,
// padding keeps pool.h's meaning (zero for average, ignored for max). a and
// dx are [N, C, H, W], y and dy [N, C, OH, OW]; a may alias x (activation in
// place), no other buffers may alias.
// Errors: kInvalidArgument for a bad shape (naming the field), kInternal for
// a CUDA launch failure, kUnimplemented for a CUDA device in a build without
// CUDA. On CUDA the work is queued on the device's stream.

#include <cstdint>

#include "absl/status/status.h"
#include "common/device.h"
#include "kernels/pool.h"

namespace ps::kernels {

enum class PoolActivation { kRelu, kSigmoid };

// a = act(x); y = avgpool(a).
absl::Status ActivationAvgPool2dForward(Device& device, PoolActivation act,
                                        const Pool2dShape& shape, const float* x, float* a,
                                        float* y);
// dx (overwritten) = act'(x) * avgpool_backward(dy), act' computed from the
// forward pass's a.
absl::Status ActivationAvgPool2dBackward(Device& device, PoolActivation act,
                                         const Pool2dShape& shape, const float* a,
                                         const float* dy, float* dx);

// a = act(x); y = maxpool(a), argmax as in MaxPool2dForward.
absl::Status ActivationMaxPool2dForward(Device& device, PoolActivation act,
                                        const Pool2dShape& shape, const float* x, float* a,
                                        float* y, int32_t* argmax);
// dx (overwritten) = act'(x) * maxpool_backward(dy, argmax), act' from a.
absl::Status ActivationMaxPool2dBackward(Device& device, PoolActivation act,
                                         const Pool2dShape& shape, const float* a,
                                         const float* dy, const int32_t* argmax, float* dx);

}  // namespace ps::kernels

#endif  // PS_KERNELS_ACTIVATION_POOL_H_
