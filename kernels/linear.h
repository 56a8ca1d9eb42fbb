#ifndef PS_KERNELS_LINEAR_H_
#define PS_KERNELS_LINEAR_H_

// Fully connected layer, PyTorch layout: weight [out, in], bias [out].
//   y[N, out] = x[N, in] * weight^T + bias
// Pointers are in `device`'s memory; work is queued on CUDA.

#include <cstdint>

#include "absl/status/status.h"
#include "common/device.h"

namespace ps::kernels {

// `bias` may be null (no bias).
absl::Status LinearForward(Device& device, int64_t batch, int64_t in_features,
                           int64_t out_features, const float* x, const float* weight,
                           const float* bias, float* y);

// Given dy [N, out]: dx [N, in], dweight [out, in] and dbias [out], each
// skipped when null (so a caller can take the parameter gradients first and
// dx in a second call, with the same results). All three are overwritten,
// not accumulated.
absl::Status LinearBackward(Device& device, int64_t batch, int64_t in_features,
                            int64_t out_features, const float* x, const float* weight,
                            const float* dy, float* dx, float* dweight, float* dbias);

// For a layer that computes in blocks of output features on a CPU device
// (model::Linear with a large weight: each block can wait for its own
// weights to arrive, and hand over its own weight gradients): the same
// values over rows [row_begin, row_end) of the weight, 0 <= row_begin <=
// row_end <= out_features. kUnimplemented on other devices.
//   LinearForwardRows:          y[:, r] = x * weight[r, :]^T, no bias;
//   LinearAddBias:              y[n, :] += bias, for every row n;
//   LinearWeightGradientRows:   dweight[r, :] = dy[:, r]^T * x.
absl::Status LinearForwardRows(Device& device, int64_t batch, int64_t in_features,
                               int64_t out_features, const float* x, const float* weight,
                               int64_t row_begin, int64_t row_end, float* y);
absl::Status LinearAddBias(Device& device, int64_t batch, int64_t out_features, const float* bias,
                           float* y);
absl::Status LinearWeightGradientRows(Device& device, int64_t batch, int64_t in_features,
                                      int64_t out_features, const float* x, const float* dy,
                                      int64_t row_begin, int64_t row_end, float* dweight);

}  // namespace ps::kernels

#endif  // PS_KERNELS_LINEAR_H_
