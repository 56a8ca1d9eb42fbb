#ifndef PS_KERNELS_SGD_CUDA_H_
#define PS_KERNELS_SGD_CUDA_H_

// CUDA launcher behind sgd.h. Queues one kernel on `stream` and returns the
// launch error (cudaSuccess when queued). Pointers are device memory of the
// GPU current on the calling thread; momentum_buf may be null only when
// momentum == 0. The hyperparameters are passed one by one so this header
// stays free of the rest of the project (nvcc sees only this file).

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ps::kernels::internal {

cudaError_t SgdUpdateCuda(cudaStream_t stream, int64_t n, float lr, float momentum,
                          float weight_decay, bool nesterov, float grad_scale, const float* grad,
                          float* param, float* momentum_buf);

}  // namespace ps::kernels::internal

#endif  // PS_KERNELS_SGD_CUDA_H_
