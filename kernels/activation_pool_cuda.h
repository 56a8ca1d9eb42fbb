#ifndef PS_KERNELS_ACTIVATION_POOL_CUDA_H_
#define PS_KERNELS_ACTIVATION_POOL_CUDA_H_

// CUDA launchers behind activation_pool.h. Each queues one kernel on `stream`
// and returns the launch error (cudaSuccess when queued). Pointers are device
// memory of the GPU current on the calling thread. `sigmoid` selects the
// activation (else ReLU), so that nvcc needs no header but this one and
// pool_cuda.h. The forward launchers queue two kernels (activation, then
// pooling of a).

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/pool_cuda.h"

namespace ps::kernels::internal {

cudaError_t ActivationAvgPool2dForwardCuda(cudaStream_t stream, bool sigmoid, const PoolDims& dims,
                                           const float* x, float* a, float* y);
cudaError_t ActivationAvgPool2dBackwardCuda(cudaStream_t stream, bool sigmoid,
                                            const PoolDims& dims, const float* a, const float* dy,
                                            float* dx);
cudaError_t ActivationMaxPool2dForwardCuda(cudaStream_t stream, bool sigmoid, const PoolDims& dims,
                                           const float* x, float* a, float* y, int32_t* argmax);
cudaError_t ActivationMaxPool2dBackwardCuda(cudaStream_t stream, bool sigmoid,
                                            const PoolDims& dims, const float* a, const float* dy,
                                            const int32_t* argmax, float* dx);

}  // namespace ps::kernels::internal

#endif  // PS_KERNELS_ACTIVATION_POOL_CUDA_H_
