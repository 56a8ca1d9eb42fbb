#include "kernels/cuda_launch.cuh"
#include "kernels/elementwise_cuda.h"

namespace ps::kernels::internal {
namespace {

__global__ void FillKernel(int64_t n, float value, float* y) {
  PS_GRID_STRIDE_LOOP(i, n) y[i] = value;
}

__global__ void ScaleKernel(int64_t n, float alpha, float* y) {
  PS_GRID_STRIDE_LOOP(i, n) y[i] *= alpha;
}

__global__ void AxpyKernel(int64_t n, float alpha, const float* x, float* y) {
  PS_GRID_STRIDE_LOOP(i, n) y[i] += alpha * x[i];
}

__global__ void AddKernel(int64_t n, const float* a, const float* b, float* out) {
  PS_GRID_STRIDE_LOOP(i, n) out[i] = a[i] + b[i];
}

}  // namespace

cudaError_t FillCuda(cudaStream_t stream, int64_t n, float value, float* y) {
  if (n == 0) return cudaSuccess;
  FillKernel<<<GridFor(n), kThreadsPerBlock, 0, stream>>>(n, value, y);
  return cudaGetLastError();
}

cudaError_t ScaleCuda(cudaStream_t stream, int64_t n, float alpha, float* y) {
  if (n == 0) return cudaSuccess;
  ScaleKernel<<<GridFor(n), kThreadsPerBlock, 0, stream>>>(n, alpha, y);
  return cudaGetLastError();
}

cudaError_t AxpyCuda(cudaStream_t stream, int64_t n, float alpha, const float* x, float* y) {
  if (n == 0) return cudaSuccess;
  AxpyKernel<<<GridFor(n), kThreadsPerBlock, 0, stream>>>(n, alpha, x, y);
  return cudaGetLastError();
}

cudaError_t AddCuda(cudaStream_t stream, int64_t n, const float* a, const float* b, float* out) {
  if (n == 0) return cudaSuccess;
  AddKernel<<<GridFor(n), kThreadsPerBlock, 0, stream>>>(n, a, b, out);
  return cudaGetLastError();
}

}  // namespace ps::kernels::internal
