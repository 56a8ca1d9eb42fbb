#ifndef PS_KERNELS_ACTIVATION_CUDA_H_
#define PS_KERNELS_ACTIVATION_CUDA_H_

// CUDA launchers behind activation.h. Each queues one kernel on `stream` and
// returns the launch error (cudaSuccess when queued). Pointers are device
// memory of the GPU current on the calling thread.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ps::kernels::internal {

cudaError_t ReluForwardCuda(cudaStream_t stream, int64_t n, const float* x, float* y);
cudaError_t ReluBackwardCuda(cudaStream_t stream, int64_t n, const float* y, const float* dy,
                             float* dx);
cudaError_t SigmoidForwardCuda(cudaStream_t stream, int64_t n, const float* x, float* y);
cudaError_t SigmoidBackwardCuda(cudaStream_t stream, int64_t n, const float* y, const float* dy,
                                float* dx);

}  // namespace ps::kernels::internal

#endif  // PS_KERNELS_ACTIVATION_CUDA_H_
