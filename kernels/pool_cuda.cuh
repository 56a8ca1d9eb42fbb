#ifndef PS_KERNELS_POOL_CUDA_CUH_
#define PS_KERNELS_POOL_CUDA_CUH_

// The pooling kernels, shared by pool_cuda.cu and activation_pool_cuda.cu so
// that plain and fused pooling are one code. Include only from .cu files.

#include "kernels/cuda_launch.cuh"
#include "kernels/pool_cuda.h"

namespace ps::kernels::internal {
namespace {

// One thread per output (forward) or per input (backward), grid-stride. The
// backward passes gather over the outputs whose windows cover an input rather
// than scattering with atomics, so they are deterministic and sum in the same
// order as the CPU reference. They store out(g, i) for input i's gradient g:
// the identity for plain pooling, the activation's derivative for the fused
// kernels.

// The output range [*begin, *end) whose windows contain input position i.
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
    // As in pool_cpu.cc: first maximum wins, NaN propagates.
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

template <class Out>
__global__ void MaxPoolBackwardKernel(PoolDims d, const float* dy, const int32_t* argmax,
                                      float* dx, Out out) {
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
    dx[i] = out(sum, i);
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
    y[i] = sum * inv_count;  // count_include_pad: always kernel_h * kernel_w
  }
}

template <class Out>
__global__ void AvgPoolBackwardKernel(PoolDims d, const float* dy, float* dx, Out out) {
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
    dx[i] = out(sum * inv_count, i);
  }
}

// The output step of plain pooling: the gradient itself.
struct IdentityOut {
  __device__ __forceinline__ float operator()(float g, int64_t) const { return g; }
};

}  // namespace
}  // namespace ps::kernels::internal

#endif  // PS_KERNELS_POOL_CUDA_CUH_
