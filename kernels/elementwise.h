#ifndef PS_KERNELS_ELEMENTWISE_H_
#define PS_KERNELS_ELEMENTWISE_H_

// Element-wise fp32 kernels. Every pointer is in `device`'s memory and holds
// at least `n` elements; `x` and `y` may alias only where stated. On CUDA the
// work is queued on the device's stream and the call returns without waiting.
// Errors: kInternal for a CUDA launch failure, kUnimplemented for a CUDA
// device in a build without CUDA.

#include <cstdint>

#include "absl/status/status.h"
#include "common/device.h"

namespace ps::kernels {

// y[i] = value.
absl::Status Fill(Device& device, int64_t n, float value, float* y);

// y[i] *= alpha.
absl::Status Scale(Device& device, int64_t n, float alpha, float* y);

// y[i] += alpha * x[i]. x may equal y.
absl::Status Axpy(Device& device, int64_t n, float alpha, const float* x, float* y);

// out[i] = a[i] + b[i]. out may equal a or b.
absl::Status Add(Device& device, int64_t n, const float* a, const float* b, float* out);

}  // namespace ps::kernels

#endif  // PS_KERNELS_ELEMENTWISE_H_
