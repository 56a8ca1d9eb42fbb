#ifndef PS_KERNELS_ELEMENTWISE_CUDA_H_
#define PS_KERNELS_ELEMENTWISE_CUDA_H_

// CUDA launchers behind elementwise.h. Each queues one kernel on `stream` and
// returns the launch error (cudaSuccess when queued). Pointers are device
// memory of the GPU current on the calling thread.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ps::kernels::internal {

cudaError_t FillCuda(cudaStream_t stream, int64_t n, float value, float* y);
cudaError_t ScaleCuda(cudaStream_t stream, int64_t n, float alpha, float* y);
cudaError_t AxpyCuda(cudaStream_t stream, int64_t n, float alpha, const float* x, float* y);
cudaError_t AddCuda(cudaStream_t stream, int64_t n, const float* a, const float* b, float* out);

}  // namespace ps::kernels::internal

#endif  // PS_KERNELS_ELEMENTWISE_CUDA_H_
