#ifndef PS_KERNELS_HALF_CONVERT_CUDA_H_
#define PS_KERNELS_HALF_CONVERT_CUDA_H_

// CUDA launcher behind the half-precision GEMM (gemm.h): rounds n fp32
// elements to bfloat16 or IEEE fp16, to nearest, ties to even (the GPU's
// __float2bfloat16_rn and __float2half_rn), into `out` (n 16-bit elements).
// Queues one kernel on `stream` and returns the launch error. Pointers are
// device memory of the GPU current on the calling thread.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ps::kernels::internal {

cudaError_t RoundToBfloat16Cuda(cudaStream_t stream, int64_t n, const float* in, void* out);
cudaError_t RoundToHalfCuda(cudaStream_t stream, int64_t n, const float* in, void* out);

}  // namespace ps::kernels::internal

#endif  // PS_KERNELS_HALF_CONVERT_CUDA_H_
