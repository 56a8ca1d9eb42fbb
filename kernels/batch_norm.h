#ifndef PS_KERNELS_BATCH_NORM_H_
#define PS_KERNELS_BATCH_NORM_H_

// Batch normalisation over [N, C, S] activations (S = H * W for BatchNorm2d,
// 1 for BatchNorm1d), per channel, PyTorch semantics:
//   training:  mean and biased variance over N * S values per channel;
//              running_mean = (1 - momentum) * running_mean + momentum * mean
//              running_var  = (1 - momentum) * running_var
//                             + momentum * var * M / (M - 1),  M = N * S
//   inference: normalise with running_mean and running_var.
//   y = gamma * (x - mean) / sqrt(var + eps) + beta
// Pointers are in `device` memory; x, y, dy, dx hold N * C * S values, the
// rest C. Errors: kInvalidArgument naming the field for a non-positive size,
// channels >= 2^31, eps < 0, momentum outside [0, 1], or (training, as in
// PyTorch) batch * spatial < 2; kInternal / kUnimplemented as for every kernel.

#include <cstdint>

#include "absl/status/status.h"
#include "common/device.h"

namespace ps::kernels {

struct BatchNormShape {
  int64_t batch = 1;
  int64_t channels = 1;
  int64_t spatial = 1;
};

// Writes y, and save_mean / save_inv_std ([C] each, 1 / sqrt(var + eps)) for
// the backward pass; updates running_mean / running_var in place.
absl::Status BatchNormForwardTraining(Device& device, const BatchNormShape& shape, float eps,
                                      float momentum, const float* x, const float* gamma,
                                      const float* beta, float* y, float* save_mean,
                                      float* save_inv_std, float* running_mean,
                                      float* running_var);

absl::Status BatchNormForwardInference(Device& device, const BatchNormShape& shape, float eps,
                                       const float* x, const float* gamma, const float* beta,
                                       const float* running_mean, const float* running_var,
                                       float* y);

// Backward of the training-mode forward: dx, dgamma, dbeta ([C]), all
// overwritten.
absl::Status BatchNormBackward(Device& device, const BatchNormShape& shape, const float* x,
                               const float* gamma, const float* save_mean,
                               const float* save_inv_std, const float* dy, float* dx,
                               float* dgamma, float* dbeta);

}  // namespace ps::kernels

#endif  // PS_KERNELS_BATCH_NORM_H_
