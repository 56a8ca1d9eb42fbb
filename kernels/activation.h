#ifndef PS_KERNELS_ACTIVATION_H_
#define PS_KERNELS_ACTIVATION_H_

// Element-wise activations over n fp32 values. Backward passes take the
// forward *output* y, which is all ReLU and sigmoid need; dx may alias dy.
// On CUDA the work is queued on the device's stream. Errors: kInvalidArgument
// for n < 0, kInternal for a CUDA launch failure, kUnimplemented for a CUDA
// device in a build without CUDA.

#include <cstdint>

#include "absl/status/status.h"
#include "common/device.h"

namespace ps::kernels {

// y = max(x, 0). y may alias x.
absl::Status ReluForward(Device& device, int64_t n, const float* x, float* y);
// dx = dy where y > 0, else 0.
absl::Status ReluBackward(Device& device, int64_t n, const float* y, const float* dy, float* dx);

// y = 1 / (1 + exp(-x)), computed without overflow for large |x|. y may alias x.
absl::Status SigmoidForward(Device& device, int64_t n, const float* x, float* y);
// dx = dy * y * (1 - y).
absl::Status SigmoidBackward(Device& device, int64_t n, const float* y, const float* dy,
                             float* dx);

}  // namespace ps::kernels

#endif  // PS_KERNELS_ACTIVATION_H_
