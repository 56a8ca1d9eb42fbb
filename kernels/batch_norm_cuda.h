#ifndef PS_KERNELS_BATCH_NORM_CUDA_H_
#define PS_KERNELS_BATCH_NORM_CUDA_H_

// CUDA launchers behind batch_norm.h. Each queues one kernel on `stream` and
// returns the launch error (cudaSuccess when queued). Pointers are device
// memory of the GPU current on the calling thread; x, y, dy, dx are
// [batch, channels, spatial], the rest [channels]. Arguments are already
// validated (batch * spatial >= 2 for training).

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ps::kernels::internal {

cudaError_t BatchNormForwardTrainingCuda(cudaStream_t stream, int64_t batch, int64_t channels,
                                         int64_t spatial, float eps, float momentum, const float* x,
                                         const float* gamma, const float* beta, float* y,
                                         float* save_mean, float* save_inv_std, float* running_mean,
                                         float* running_var);

cudaError_t BatchNormForwardInferenceCuda(cudaStream_t stream, int64_t batch, int64_t channels,
                                          int64_t spatial, float eps, const float* x,
                                          const float* gamma, const float* beta,
                                          const float* running_mean, const float* running_var,
                                          float* y);

cudaError_t BatchNormBackwardCuda(cudaStream_t stream, int64_t batch, int64_t channels,
                                  int64_t spatial, const float* x, const float* gamma,
                                  const float* save_mean, const float* save_inv_std,
                                  const float* dy, float* dx, float* dgamma, float* dbeta);

}  // namespace ps::kernels::internal

#endif  // PS_KERNELS_BATCH_NORM_CUDA_H_
