#include "kernels/batch_norm_cuda.h"
#include "kernels/cuda_launch.cuh"

namespace ps::kernels::internal {
namespace {

// The training forward and the backward pass run one block per channel: the
// block strides over the channel's batch * spatial values, then reduces its
// threads' partial sums with a fixed shuffle tree, so results are
// deterministic and need no atomics or second launch. Sums are accumulated in
// double, like the CPU reference, so the two agree to float rounding of the
// outputs. A block of 512 threads keeps enough loads in flight per SM when
// there are fewer channels than SMs.
constexpr int kBnThreads = 512;
constexpr int kBnWarps = kBnThreads / 32;

// Offset of the i-th value (batch-major) of channel c in [N, C, S].
__device__ __forceinline__ int64_t ChannelOffset(int64_t i, int64_t c, int64_t channels,
                                                 int64_t spatial) {
  const int64_t n = i / spatial;
  return (n * channels + c) * spatial + (i - n * spatial);
}

__device__ __forceinline__ double WarpSum(double v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  return v;
}

// Sums a and b over the block; the totals are valid in thread 0. `shared`
// holds 2 * kBnWarps doubles. Ends with a barrier, so `shared` may be reused.
__device__ void BlockSum2(double* a, double* b, double* shared) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  double va = WarpSum(*a);
  double vb = WarpSum(*b);
  if (lane == 0) {
    shared[warp] = va;
    shared[kBnWarps + warp] = vb;
  }
  __syncthreads();
  if (warp == 0) {
    va = lane < kBnWarps ? shared[lane] : 0.0;
    vb = lane < kBnWarps ? shared[kBnWarps + lane] : 0.0;
    va = WarpSum(va);
    vb = WarpSum(vb);
  }
  *a = va;
  *b = vb;
  __syncthreads();
}

__global__ void __launch_bounds__(kBnThreads)
    ForwardTrainingKernel(int64_t batch, int64_t channels, int64_t spatial, float eps,
                          float momentum, const float* x, const float* gamma, const float* beta,
                          float* y, float* save_mean, float* save_inv_std, float* running_mean,
                          float* running_var) {
  __shared__ double partial[2 * kBnWarps];
  __shared__ double shared_mean;
  __shared__ float shared_mean_f, shared_inv_std;
  const int64_t c = blockIdx.x;
  const int64_t m = batch * spatial;

  // 1. mean.
  double sum = 0, unused = 0;
  for (int64_t i = threadIdx.x; i < m; i += kBnThreads) {
    sum += x[ChannelOffset(i, c, channels, spatial)];
  }
  BlockSum2(&sum, &unused, partial);
  if (threadIdx.x == 0) shared_mean = sum / m;
  __syncthreads();
  const double mean = shared_mean;

  // 2. biased variance from squared deviations (no E[x^2] - E[x]^2
  //    cancellation).
  double sq = 0;
  for (int64_t i = threadIdx.x; i < m; i += kBnThreads) {
    const double d = x[ChannelOffset(i, c, channels, spatial)] - mean;
    sq += d * d;
  }
  unused = 0;
  BlockSum2(&sq, &unused, partial);

  // 3. saved and running statistics (running variance unbiased, m >= 2).
  if (threadIdx.x == 0) {
    const double var = sq / m;
    const float inv_std = static_cast<float>(1.0 / sqrt(var + eps));
    shared_mean_f = static_cast<float>(mean);
    shared_inv_std = inv_std;
    save_mean[c] = static_cast<float>(mean);
    save_inv_std[c] = inv_std;
    running_mean[c] = static_cast<float>((1.0 - momentum) * running_mean[c] + momentum * mean);
    running_var[c] =
        static_cast<float>((1.0 - momentum) * running_var[c] + momentum * var * m / (m - 1));
  }
  __syncthreads();

  // 4. normalise.
  const float mean_f = shared_mean_f;
  const float scale = gamma[c] * shared_inv_std;
  const float shift = beta[c];
  for (int64_t i = threadIdx.x; i < m; i += kBnThreads) {
    const int64_t off = ChannelOffset(i, c, channels, spatial);
    y[off] = (x[off] - mean_f) * scale + shift;
  }
}

__global__ void ForwardInferenceKernel(int64_t batch, int64_t channels, int64_t spatial, float eps,
                                       const float* x, const float* gamma, const float* beta,
                                       const float* running_mean, const float* running_var,
                                       float* y) {
  PS_GRID_STRIDE_LOOP(i, batch * channels * spatial) {
    const int64_t c = (i / spatial) % channels;
    const float scale = gamma[c] * (1.f / sqrtf(running_var[c] + eps));
    y[i] = (x[i] - running_mean[c]) * scale + beta[c];
  }
}

__global__ void __launch_bounds__(kBnThreads)
    BackwardKernel(int64_t batch, int64_t channels, int64_t spatial, const float* x,
                   const float* gamma, const float* save_mean, const float* save_inv_std,
                   const float* dy, float* dx, float* dgamma, float* dbeta) {
  __shared__ double partial[2 * kBnWarps];
  __shared__ float shared_mean_dy, shared_mean_dy_xhat;
  const int64_t c = blockIdx.x;
  const int64_t m = batch * spatial;
  const double mean = save_mean[c];
  const double inv_std = save_inv_std[c];

  // 1. dbeta = sum dy, dgamma = sum dy * xhat.
  double sum_dy = 0, sum_dy_xhat = 0;
  for (int64_t i = threadIdx.x; i < m; i += kBnThreads) {
    const int64_t off = ChannelOffset(i, c, channels, spatial);
    const double g = dy[off];
    sum_dy += g;
    sum_dy_xhat += g * ((x[off] - mean) * inv_std);
  }
  BlockSum2(&sum_dy, &sum_dy_xhat, partial);
  if (threadIdx.x == 0) {
    dbeta[c] = static_cast<float>(sum_dy);
    dgamma[c] = static_cast<float>(sum_dy_xhat);
    shared_mean_dy = static_cast<float>(sum_dy / m);
    shared_mean_dy_xhat = static_cast<float>(sum_dy_xhat / m);
  }
  __syncthreads();

  // 2. dx = gamma * inv_std * (dy - mean(dy) - xhat * mean(dy * xhat)).
  const float k = static_cast<float>(gamma[c] * inv_std);
  const float mean_dy = shared_mean_dy;
  const float mean_dy_xhat = shared_mean_dy_xhat;
  const float mean_f = save_mean[c];
  const float inv_std_f = save_inv_std[c];
  for (int64_t i = threadIdx.x; i < m; i += kBnThreads) {
    const int64_t off = ChannelOffset(i, c, channels, spatial);
    const float xhat = (x[off] - mean_f) * inv_std_f;
    dx[off] = k * (dy[off] - mean_dy - xhat * mean_dy_xhat);
  }
}

}  // namespace

cudaError_t BatchNormForwardTrainingCuda(cudaStream_t stream, int64_t batch, int64_t channels,
                                         int64_t spatial, float eps, float momentum, const float* x,
                                         const float* gamma, const float* beta, float* y,
                                         float* save_mean, float* save_inv_std, float* running_mean,
                                         float* running_var) {
  if (channels == 0) return cudaSuccess;
  ForwardTrainingKernel<<<static_cast<unsigned int>(channels), kBnThreads, 0, stream>>>(
      batch, channels, spatial, eps, momentum, x, gamma, beta, y, save_mean, save_inv_std,
      running_mean, running_var);
  return cudaGetLastError();
}

cudaError_t BatchNormForwardInferenceCuda(cudaStream_t stream, int64_t batch, int64_t channels,
                                          int64_t spatial, float eps, const float* x,
                                          const float* gamma, const float* beta,
                                          const float* running_mean, const float* running_var,
                                          float* y) {
  const int64_t n = batch * channels * spatial;
  if (n == 0) return cudaSuccess;
  ForwardInferenceKernel<<<GridFor(n), kThreadsPerBlock, 0, stream>>>(
      batch, channels, spatial, eps, x, gamma, beta, running_mean, running_var, y);
  return cudaGetLastError();
}

cudaError_t BatchNormBackwardCuda(cudaStream_t stream, int64_t batch, int64_t channels,
                                  int64_t spatial, const float* x, const float* gamma,
                                  const float* save_mean, const float* save_inv_std,
                                  const float* dy, float* dx, float* dgamma, float* dbeta) {
  if (channels == 0) return cudaSuccess;
  BackwardKernel<<<static_cast<unsigned int>(channels), kBnThreads, 0, stream>>>(
      batch, channels, spatial, x, gamma, save_mean, save_inv_std, dy, dx, dgamma, dbeta);
  return cudaGetLastError();
}

}  // namespace ps::kernels::internal
