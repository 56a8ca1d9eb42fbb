#include "kernels/activation_pool_cuda.h"
#include "kernels/cuda_launch.cuh"

namespace ps::kernels::internal {
namespace {

// Forward: one element-wise kernel writes a = act(x), then pool_cuda.cu's
// pooling kernel reads a. Backward: pool_cuda.cu's gather, one thread per
// input, with the activation's derivative (from a) applied to the gathered
// gradient. Grid-stride, deterministic. Formulas as in activation_cuda.cu.

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

__device__ __forceinline__ void OutputsCovering(int64_t i, int64_t kernel, int64_t stride,
                                                int64_t pad, int64_t out_size, int64_t* begin,
                                                int64_t* end) {
  const int64_t p = i + pad;
  *begin = p < kernel ? 0 : (p - kernel) / stride + 1;
  *end = min(p / stride + 1, out_size);
}

__global__ void MaxPoolForwardKernel(PoolDims d, const float* x, float* y, int32_t* argmax) {
  const int64_t total = d.batch * d.channels * d.out_h * d.out_w;
  PS_GRID_STRIDE_LOOP(i, total) {
    const int64_t ow = i % d.out_w;
    const int64_t oh = (i / d.out_w) % d.out_h;
    const int64_t plane = i / (d.out_w * d.out_h);
    const float* xp = x + plane * d.height * d.width;
    const int64_t h0 = max(oh * d.stride_h - d.pad_h, int64_t{0});
    const int64_t h1 = min(oh * d.stride_h - d.pad_h + d.kernel_h, d.height);
    const int64_t w0 = max(ow * d.stride_w - d.pad_w, int64_t{0});
    const int64_t w1 = min(ow * d.stride_w - d.pad_w + d.kernel_w, d.width);
    int64_t best = h0 * d.width + w0;
    float best_v = -INFINITY;
    for (int64_t h = h0; h < h1; ++h) {
      for (int64_t w = w0; w < w1; ++w) {
        const float v = xp[h * d.width + w];
        if (v > best_v || isnan(v)) {
          best_v = v;
          best = h * d.width + w;
        }
      }
    }
    y[i] = best_v;
    argmax[i] = static_cast<int32_t>(best);
  }
}

__global__ void ActMaxPoolBackwardKernel(bool sigmoid, PoolDims d, const float* a,
                                         const float* dy, const int32_t* argmax, float* dx) {
  const int64_t total = d.batch * d.channels * d.height * d.width;
  PS_GRID_STRIDE_LOOP(i, total) {
    const int64_t w = i % d.width;
    const int64_t h = (i / d.width) % d.height;
    const int64_t plane = i / (d.width * d.height);
    const int64_t out_plane = d.out_h * d.out_w;
    const float* dyp = dy + plane * out_plane;
    const int32_t* ap = argmax + plane * out_plane;
    const int32_t self = static_cast<int32_t>(h * d.width + w);
    int64_t oh0, oh1, ow0, ow1;
    OutputsCovering(h, d.kernel_h, d.stride_h, d.pad_h, d.out_h, &oh0, &oh1);
    OutputsCovering(w, d.kernel_w, d.stride_w, d.pad_w, d.out_w, &ow0, &ow1);
    float sum = 0.f;
    for (int64_t oh = oh0; oh < oh1; ++oh) {
      for (int64_t ow = ow0; ow < ow1; ++ow) {
        const int64_t o = oh * d.out_w + ow;
        if (ap[o] == self) sum += dyp[o];
      }
    }
    dx[i] = ActBackward(sigmoid, sum, a[i]);
  }
}

__global__ void AvgPoolForwardKernel(PoolDims d, const float* x, float* y) {
  const int64_t total = d.batch * d.channels * d.out_h * d.out_w;
  const float inv_count = 1.f / static_cast<float>(d.kernel_h * d.kernel_w);
  PS_GRID_STRIDE_LOOP(i, total) {
    const int64_t ow = i % d.out_w;
    const int64_t oh = (i / d.out_w) % d.out_h;
    const int64_t plane = i / (d.out_w * d.out_h);
    const float* xp = x + plane * d.height * d.width;
    const int64_t h0 = max(oh * d.stride_h - d.pad_h, int64_t{0});
    const int64_t h1 = min(oh * d.stride_h - d.pad_h + d.kernel_h, d.height);
    const int64_t w0 = max(ow * d.stride_w - d.pad_w, int64_t{0});
    const int64_t w1 = min(ow * d.stride_w - d.pad_w + d.kernel_w, d.width);
    float sum = 0.f;
    for (int64_t h = h0; h < h1; ++h) {
      for (int64_t w = w0; w < w1; ++w) sum += xp[h * d.width + w];
    }
    y[i] = sum * inv_count;
  }
}

__global__ void ActAvgPoolBackwardKernel(bool sigmoid, PoolDims d, const float* a,
                                         const float* dy, float* dx) {
  const int64_t total = d.batch * d.channels * d.height * d.width;
  const float inv_count = 1.f / static_cast<float>(d.kernel_h * d.kernel_w);
  PS_GRID_STRIDE_LOOP(i, total) {
    const int64_t w = i % d.width;
    const int64_t h = (i / d.width) % d.height;
    const int64_t plane = i / (d.width * d.height);
    const float* dyp = dy + plane * d.out_h * d.out_w;
    int64_t oh0, oh1, ow0, ow1;
    OutputsCovering(h, d.kernel_h, d.stride_h, d.pad_h, d.out_h, &oh0, &oh1);
    OutputsCovering(w, d.kernel_w, d.stride_w, d.pad_w, d.out_w, &ow0, &ow1);
    float sum = 0.f;
    for (int64_t oh = oh0; oh < oh1; ++oh) {
      for (int64_t ow = ow0; ow < ow1; ++ow) sum += dyp[oh * d.out_w + ow];
    }
    dx[i] = ActBackward(sigmoid, sum * inv_count, a[i]);
  }
}

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
  ActAvgPoolBackwardKernel<<<GridFor(n), kThreadsPerBlock, 0, stream>>>(sigmoid, dims, a, dy, dx);
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
  ActMaxPoolBackwardKernel<<<GridFor(n), kThreadsPerBlock, 0, stream>>>(sigmoid, dims, a, dy,
                                                                        argmax, dx);
  return cudaGetLastError();
}

}  // namespace ps::kernels::internal
