#include "kernels/activation_cuda.h"
#include "kernels/cuda_launch.cuh"

namespace ps::kernels::internal {
namespace {

// Same formulas as activation_cpu.cc. expf (not __expf: this file is built
// without --use_fast_math) keeps the GPU within a few ulps of the CPU.
__device__ __forceinline__ float Relu(float x) { return x < 0.f ? 0.f : x; }

__device__ __forceinline__ float Sigmoid(float x) {
  if (x >= 0.f) return 1.f / (1.f + expf(-x));
  const float e = expf(x);
  return e / (1.f + e);
}

__global__ void ReluForwardKernel(int64_t n, const float* x, float* y) {
  PS_GRID_STRIDE_LOOP(i, n) y[i] = Relu(x[i]);
}

__global__ void ReluBackwardKernel(int64_t n, const float* y, const float* dy, float* dx) {
  PS_GRID_STRIDE_LOOP(i, n) dx[i] = y[i] > 0.f ? dy[i] : 0.f;
}

__global__ void SigmoidForwardKernel(int64_t n, const float* x, float* y) {
  PS_GRID_STRIDE_LOOP(i, n) y[i] = Sigmoid(x[i]);
}

__global__ void SigmoidBackwardKernel(int64_t n, const float* y, const float* dy, float* dx) {
  PS_GRID_STRIDE_LOOP(i, n) {
    const float yi = y[i];
    dx[i] = dy[i] * yi * (1.f - yi);
  }
}

}  // namespace

cudaError_t ReluForwardCuda(cudaStream_t stream, int64_t n, const float* x, float* y) {
  if (n == 0) return cudaSuccess;
  ReluForwardKernel<<<GridFor(n), kThreadsPerBlock, 0, stream>>>(n, x, y);
  return cudaGetLastError();
}

cudaError_t ReluBackwardCuda(cudaStream_t stream, int64_t n, const float* y, const float* dy,
                             float* dx) {
  if (n == 0) return cudaSuccess;
  ReluBackwardKernel<<<GridFor(n), kThreadsPerBlock, 0, stream>>>(n, y, dy, dx);
  return cudaGetLastError();
}

cudaError_t SigmoidForwardCuda(cudaStream_t stream, int64_t n, const float* x, float* y) {
  if (n == 0) return cudaSuccess;
  SigmoidForwardKernel<<<GridFor(n), kThreadsPerBlock, 0, stream>>>(n, x, y);
  return cudaGetLastError();
}

cudaError_t SigmoidBackwardCuda(cudaStream_t stream, int64_t n, const float* y, const float* dy,
                                float* dx) {
  if (n == 0) return cudaSuccess;
  SigmoidBackwardKernel<<<GridFor(n), kThreadsPerBlock, 0, stream>>>(n, y, dy, dx);
  return cudaGetLastError();
}

}  // namespace ps::kernels::internal
