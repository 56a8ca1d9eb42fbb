#include "kernels/pool_cuda.cuh"

namespace ps::kernels::internal {

cudaError_t MaxPool2dForwardCuda(cudaStream_t stream, const PoolDims& dims, const float* x,
                                 float* y, int32_t* argmax) {
  const int64_t n = dims.batch * dims.channels * dims.out_h * dims.out_w;
  if (n == 0) return cudaSuccess;
  MaxPoolForwardKernel<<<GridFor(n), kThreadsPerBlock, 0, stream>>>(dims, x, y, argmax);
  return cudaGetLastError();
}

cudaError_t MaxPool2dBackwardCuda(cudaStream_t stream, const PoolDims& dims, const float* dy,
                                  const int32_t* argmax, float* dx) {
  const int64_t n = dims.batch * dims.channels * dims.height * dims.width;
  if (n == 0) return cudaSuccess;
  MaxPoolBackwardKernel<<<GridFor(n), kThreadsPerBlock, 0, stream>>>(dims, dy, argmax, dx,
                                                                     IdentityOut());
  return cudaGetLastError();
}

cudaError_t AvgPool2dForwardCuda(cudaStream_t stream, const PoolDims& dims, const float* x,
                                 float* y) {
  const int64_t n = dims.batch * dims.channels * dims.out_h * dims.out_w;
  if (n == 0) return cudaSuccess;
  AvgPoolForwardKernel<<<GridFor(n), kThreadsPerBlock, 0, stream>>>(dims, x, y);
  return cudaGetLastError();
}

cudaError_t AvgPool2dBackwardCuda(cudaStream_t stream, const PoolDims& dims, const float* dy,
                                  float* dx) {
  const int64_t n = dims.batch * dims.channels * dims.height * dims.width;
  if (n == 0) return cudaSuccess;
  AvgPoolBackwardKernel<<<GridFor(n), kThreadsPerBlock, 0, stream>>>(dims, dy, dx, IdentityOut());
  return cudaGetLastError();
}

}  // namespace ps::kernels::internal
