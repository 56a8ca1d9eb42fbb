#include "kernels/conv_cuda.h"
#include "kernels/cuda_launch.cuh"

namespace ps::kernels::internal {
namespace {

// One thread per column entry, in storage order, so the writes coalesce; the
// reads of neighbouring threads hit neighbouring input pixels.
__global__ void Im2ColKernel(ConvGeometry g, int64_t count, const float* x, float* cols) {
  const int64_t pixels = g.out_height * g.out_width;
  const int64_t total = g.in_channels * g.kernel_h * g.kernel_w * count * pixels;
  PS_GRID_STRIDE_LOOP(idx, total) {
    const int64_t ow = idx % g.out_width;
    int64_t t = idx / g.out_width;
    const int64_t oh = t % g.out_height;
    t /= g.out_height;
    const int64_t s = t % count;
    const int64_t row = t / count;
    const int64_t j = row % g.kernel_w;
    const int64_t i = (row / g.kernel_w) % g.kernel_h;
    const int64_t c = row / (g.kernel_w * g.kernel_h);
    const int64_t ih = oh * g.stride_h - g.pad_h + i;
    const int64_t iw = ow * g.stride_w - g.pad_w + j;
    float v = 0.f;
    if (ih >= 0 && ih < g.height && iw >= 0 && iw < g.width) {
      v = x[((s * g.in_channels + c) * g.height + ih) * g.width + iw];
    }
    cols[idx] = v;
  }
}

// One thread per input element, gathering every column entry that read it:
// no atomics, so the result is deterministic.
__global__ void Col2ImKernel(ConvGeometry g, int64_t count, const float* cols, float* dx) {
  const int64_t pixels = g.out_height * g.out_width;
  const int64_t ld = count * pixels;
  const int64_t total = count * g.in_channels * g.height * g.width;
  PS_GRID_STRIDE_LOOP(idx, total) {
    const int64_t iw = idx % g.width;
    int64_t t = idx / g.width;
    const int64_t ih = t % g.height;
    t /= g.height;
    const int64_t c = t % g.in_channels;
    const int64_t s = t / g.in_channels;
    float sum = 0.f;
    for (int64_t i = 0; i < g.kernel_h; ++i) {
      const int64_t oh_stride = ih + g.pad_h - i;  // oh * stride_h
      if (oh_stride < 0 || oh_stride % g.stride_h != 0) continue;
      const int64_t oh = oh_stride / g.stride_h;
      if (oh >= g.out_height) continue;
      for (int64_t j = 0; j < g.kernel_w; ++j) {
        const int64_t ow_stride = iw + g.pad_w - j;
        if (ow_stride < 0 || ow_stride % g.stride_w != 0) continue;
        const int64_t ow = ow_stride / g.stride_w;
        if (ow >= g.out_width) continue;
        const int64_t row = (c * g.kernel_h + i) * g.kernel_w + j;
        sum += cols[row * ld + s * pixels + oh * g.out_width + ow];
      }
    }
    dx[idx] = sum;
  }
}

__global__ void BlockToNchwKernel(int64_t count, int64_t channels, int64_t pixels,
                                  const float* block, const float* bias, float* y) {
  const int64_t total = count * channels * pixels;
  const int64_t ld = count * pixels;
  PS_GRID_STRIDE_LOOP(idx, total) {
    const int64_t p = idx % pixels;
    const int64_t t = idx / pixels;
    const int64_t c = t % channels;
    const int64_t s = t / channels;
    y[idx] = block[c * ld + s * pixels + p] + (bias != nullptr ? bias[c] : 0.f);
  }
}

__global__ void NchwToBlockKernel(int64_t count, int64_t channels, int64_t pixels, const float* y,
                                  float* block) {
  const int64_t total = count * channels * pixels;
  const int64_t ld = count * pixels;
  PS_GRID_STRIDE_LOOP(idx, total) {
    const int64_t p = idx % pixels;
    const int64_t t = idx / pixels;
    const int64_t c = t % channels;
    const int64_t s = t / channels;
    block[c * ld + s * pixels + p] = y[idx];
  }
}

__global__ void RowSumsKernel(int64_t cols, const float* m, bool accumulate, float* sums) {
  __shared__ float partial[kThreadsPerBlock];
  const int64_t row = blockIdx.x;
  const float* src = m + row * cols;
  float sum = 0.f;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) sum += src[i];
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) sums[row] = (accumulate ? sums[row] : 0.f) + partial[0];
}

}  // namespace

cudaError_t Im2ColCuda(cudaStream_t stream, const ConvGeometry& g, int64_t count, const float* x,
                       float* cols) {
  const int64_t total =
      g.in_channels * g.kernel_h * g.kernel_w * count * g.out_height * g.out_width;
  if (total == 0) return cudaSuccess;
  Im2ColKernel<<<GridFor(total), kThreadsPerBlock, 0, stream>>>(g, count, x, cols);
  return cudaGetLastError();
}

cudaError_t Col2ImCuda(cudaStream_t stream, const ConvGeometry& g, int64_t count, const float* cols,
                       float* dx) {
  const int64_t total = count * g.in_channels * g.height * g.width;
  if (total == 0) return cudaSuccess;
  Col2ImKernel<<<GridFor(total), kThreadsPerBlock, 0, stream>>>(g, count, cols, dx);
  return cudaGetLastError();
}

cudaError_t BlockToNchwCuda(cudaStream_t stream, int64_t count, int64_t channels, int64_t pixels,
                            const float* block, const float* bias, float* y) {
  const int64_t total = count * channels * pixels;
  if (total == 0) return cudaSuccess;
  BlockToNchwKernel<<<GridFor(total), kThreadsPerBlock, 0, stream>>>(count, channels, pixels, block,
                                                                     bias, y);
  return cudaGetLastError();
}

cudaError_t NchwToBlockCuda(cudaStream_t stream, int64_t count, int64_t channels, int64_t pixels,
                            const float* y, float* block) {
  const int64_t total = count * channels * pixels;
  if (total == 0) return cudaSuccess;
  NchwToBlockKernel<<<GridFor(total), kThreadsPerBlock, 0, stream>>>(count, channels, pixels, y,
                                                                     block);
  return cudaGetLastError();
}

cudaError_t RowSumsCuda(cudaStream_t stream, int64_t rows, int64_t cols, const float* m,
                        bool accumulate, float* sums) {
  if (rows == 0) return cudaSuccess;
  // Grid x holds up to 2^31 - 1 blocks; callers' row counts (channels) are
  // far below that.
  RowSumsKernel<<<static_cast<unsigned int>(rows), kThreadsPerBlock, 0, stream>>>(cols, m,
                                                                                  accumulate, sums);
  return cudaGetLastError();
}

}  // namespace ps::kernels::internal
