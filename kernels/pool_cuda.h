#ifndef PS_KERNELS_POOL_CUDA_H_
#define PS_KERNELS_POOL_CUDA_H_

// CUDA launchers behind pool.h. Each queues one kernel on `stream` and
// returns the launch error (cudaSuccess when queued). Pointers are device
// memory of the GPU current on the calling thread.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ps::kernels::internal {

// Pool2dShape with its output size, restated without pool.h so that nvcc
// sees only this header. Already validated.
struct PoolDims {
  int64_t batch, channels, height, width;
  int64_t kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w;
  int64_t out_h, out_w;
};

cudaError_t MaxPool2dForwardCuda(cudaStream_t stream, const PoolDims& dims, const float* x,
                                 float* y, int32_t* argmax);
cudaError_t MaxPool2dBackwardCuda(cudaStream_t stream, const PoolDims& dims, const float* dy,
                                  const int32_t* argmax, float* dx);
cudaError_t AvgPool2dForwardCuda(cudaStream_t stream, const PoolDims& dims, const float* x,
                                 float* y);
cudaError_t AvgPool2dBackwardCuda(cudaStream_t stream, const PoolDims& dims, const float* dy,
                                  float* dx);

}  // namespace ps::kernels::internal

#endif  // PS_KERNELS_POOL_CUDA_H_
