#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda_launch.cuh"
#include "kernels/half_convert_cuda.h"

namespace ps::kernels::internal {
namespace {

__global__ void RoundToBfloat16Kernel(int64_t n, const float* in, __nv_bfloat16* out) {
  PS_GRID_STRIDE_LOOP(i, n) { out[i] = __float2bfloat16_rn(in[i]); }
}

__global__ void RoundToHalfKernel(int64_t n, const float* in, __half* out) {
  PS_GRID_STRIDE_LOOP(i, n) { out[i] = __float2half_rn(in[i]); }
}

}  // namespace

cudaError_t RoundToBfloat16Cuda(cudaStream_t stream, int64_t n, const float* in, void* out) {
  if (n == 0) return cudaSuccess;
  RoundToBfloat16Kernel<<<GridFor(n), kThreadsPerBlock, 0, stream>>>(
      n, in, static_cast<__nv_bfloat16*>(out));
  return cudaGetLastError();
}

cudaError_t RoundToHalfCuda(cudaStream_t stream, int64_t n, const float* in, void* out) {
  if (n == 0) return cudaSuccess;
  RoundToHalfKernel<<<GridFor(n), kThreadsPerBlock, 0, stream>>>(n, in, static_cast<__half*>(out));
  return cudaGetLastError();
}

}  // namespace ps::kernels::internal
