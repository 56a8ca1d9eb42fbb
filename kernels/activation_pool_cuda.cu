#include "kernels/activation_pool_cuda.h"
#include "kernels/pool_cuda.cuh"

namespace ps::kernels::internal {
namespace {

// Forward: one element-wise kernel writes a = act(x), then pool_cuda.cuh's
// pooling kernel reads a. Backward: pool_cuda.cuh's gather, one thread per
// input, with the activation's derivative (from a) as its output step.
// Grid-stride, deterministic. Formulas as in activation_cuda.cu.

__device__ __forceinline__ float Act(bool sigmoid, float x) {
  if (!sigmoid) return x < 0.f ? 0.f : x;
  if (x >= 0.f) return 1.f / (1.f + expf(-x));
  const float e = expf(x);
  return e / (1.f + e);
}

// The gradient of x from the gradient g of a = act(x).
__device__ __forceinline__ float ActBackward(bool sigmoid, float g, float a) {
  if (!sigmoid) return a > 0.f ? g : 0.f;
  return g * a * (1.f - a);
}

__global__ void ActivateKernel(bool sigmoid, int64_t n, const float* x, float* a) {
  PS_GRID_STRIDE_LOOP(i, n) a[i] = Act(sigmoid, x[i]);
}

// The fused kernels' output step: the gradient of x from the gradient g of
// a = act(x).
struct ActivationOut {
  bool sigmoid;
  const float* a;
  __device__ __forceinline__ float operator()(float g, int64_t i) const {
    return ActBackward(sigmoid, g, a[i]);
  }
};

}  // namespace

cudaError_t ActivationAvgPool2dForwardCuda(cudaStream_t stream, bool sigmoid, const PoolDims& dims,
                                           const float* x, float* a, float* y) {
  const int64_t n_in = dims.batch * dims.channels * dims.height * dims.width;
  const int64_t n_out = dims.batch * dims.channels * dims.out_h * dims.out_w;
  if (n_in == 0) return cudaSuccess;
  ActivateKernel<<<GridFor(n_in), kThreadsPerBlock, 0, stream>>>(sigmoid, n_in, x, a);
  AvgPoolForwardKernel<<<GridFor(n_out), kThreadsPerBlock, 0, stream>>>(dims, a, y);
  return cudaGetLastError();
}

cudaError_t ActivationAvgPool2dBackwardCuda(cudaStream_t stream, bool sigmoid,
                                            const PoolDims& dims, const float* a, const float* dy,
                                            float* dx) {
  const int64_t n = dims.batch * dims.channels * dims.height * dims.width;
  if (n == 0) return cudaSuccess;
  AvgPoolBackwardKernel<<<GridFor(n), kThreadsPerBlock, 0, stream>>>(dims, dy, dx,
                                                                     ActivationOut{sigmoid, a});
  return cudaGetLastError();
}

cudaError_t ActivationMaxPool2dForwardCuda(cudaStream_t stream, bool sigmoid, const PoolDims& dims,
                                           const float* x, float* a, float* y, int32_t* argmax) {
  const int64_t n_in = dims.batch * dims.channels * dims.height * dims.width;
  const int64_t n_out = dims.batch * dims.channels * dims.out_h * dims.out_w;
  if (n_in == 0) return cudaSuccess;
  ActivateKernel<<<GridFor(n_in), kThreadsPerBlock, 0, stream>>>(sigmoid, n_in, x, a);
  MaxPoolForwardKernel<<<GridFor(n_out), kThreadsPerBlock, 0, stream>>>(dims, a, y, argmax);
  return cudaGetLastError();
}

cudaError_t ActivationMaxPool2dBackwardCuda(cudaStream_t stream, bool sigmoid,
                                            const PoolDims& dims, const float* a, const float* dy,
                                            const int32_t* argmax, float* dx) {
  const int64_t n = dims.batch * dims.channels * dims.height * dims.width;
  if (n == 0) return cudaSuccess;
  MaxPoolBackwardKernel<<<GridFor(n), kThreadsPerBlock, 0, stream>>>(
      dims, dy, argmax, dx, ActivationOut{sigmoid, a});
  return cudaGetLastError();
}

}  // namespace ps::kernels::internal
