#include "kernels/cuda_launch.cuh"
#include "kernels/softmax_cross_entropy_cuda.h"

namespace ps::kernels::internal {
namespace {

// One warp per row: class counts are small (10 to ~1000), so 32 lanes
// striding over a row keep loads coalesced without idle threads.
constexpr int kWarpSize = 32;
constexpr int kRowsPerBlock = kThreadsPerBlock / kWarpSize;
// Cap on first-pass blocks (and so on partials for the second pass).
constexpr int64_t kMaxBlocks = 1024;
constexpr unsigned kFullMask = 0xffffffffu;

int64_t RowBlocks(int64_t batch) {
  const int64_t blocks = (batch + kRowsPerBlock - 1) / kRowsPerBlock;
  return std::max<int64_t>(1, std::min(blocks, kMaxBlocks));
}

// The first maximum of the row, on every lane. Each lane scans its columns
// in increasing order keeping the first maximum; lanes then combine keeping
// the larger value, or on a tie the smaller index, which is the row's first
// maximum whatever the combining order, as on the CPU.
__device__ __forceinline__ void RowArgmax(const float* x, int64_t classes, int lane,
                                          float* best_out, int32_t* idx_out) {
  float best = -INFINITY;
  int32_t idx = INT32_MAX;  // no column yet
  for (int64_t j = lane; j < classes; j += kWarpSize) {
    const float v = x[j];
    if (idx == INT32_MAX || v > best) {
      best = v;
      idx = static_cast<int32_t>(j);
    }
  }
  for (int mask = kWarpSize / 2; mask > 0; mask /= 2) {
    const float other = __shfl_xor_sync(kFullMask, best, mask);
    const int32_t other_idx = __shfl_xor_sync(kFullMask, idx, mask);
    if (other > best || (other == best && other_idx < idx)) {
      best = other;
      idx = other_idx;
    }
  }
  *best_out = best;
  *idx_out = idx;
}

// Sum over the warp with a fixed tree (shfl_down), broadcast from lane 0 so
// every lane sees the same rounding.
__device__ __forceinline__ float WarpSumBroadcast(float v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    v += __shfl_down_sync(kFullMask, v, offset);
  }
  return __shfl_sync(kFullMask, v, 0);
}

// Pass 1: each warp handles rows warp_id, warp_id + total_warps, ...; lane 0
// accumulates its rows' loss and hits; thread 0 adds the block's warps in
// order and writes partials[block] (loss) and partials[blocks + block]
// (correct count).
__global__ void RowsKernel(int64_t batch, int64_t classes, const float* logits,
                           const int32_t* labels, float grad_scale, float* dlogits,
                           double* partials) {
  __shared__ double warp_loss[kRowsPerBlock];
  __shared__ double warp_hits[kRowsPerBlock];
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  double loss = 0, hits = 0;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + warp; row < batch;
       row += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const float* x = logits + row * classes;
    const int32_t label = labels[row];
    const bool valid = label >= 0 && label < classes;
    // 1. the row maximum, subtracted so expf() never overflows.
    float max;
    int32_t argmax;
    RowArgmax(x, classes, lane, &max, &argmax);
    // 2. sum_j exp(x_j - max) >= 1.
    float part = 0.f;
    for (int64_t j = lane; j < classes; j += kWarpSize) part += expf(x[j] - max);
    const float sum = WarpSumBroadcast(part);
    // 3. loss = log(sum) + max - x[label], accumulated in double.
    if (lane == 0 && valid) {
      loss += (static_cast<double>(max) - static_cast<double>(x[label])) + log(double(sum));
      hits += argmax == label ? 1.0 : 0.0;
    }
    // 4. dlogits = grad_scale * (softmax - onehot); a zero row for a bad label.
    if (dlogits != nullptr) {
      float* d = dlogits + row * classes;
      const float inv_sum = 1.f / sum;
      for (int64_t j = lane; j < classes; j += kWarpSize) {
        d[j] = valid ? grad_scale * (expf(x[j] - max) * inv_sum - (j == label ? 1.f : 0.f)) : 0.f;
      }
    }
  }
  if (lane == 0) {
    warp_loss[warp] = loss;
    warp_hits[warp] = hits;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double block_loss = 0, block_hits = 0;
    for (int w = 0; w < kRowsPerBlock; ++w) {
      block_loss += warp_loss[w];
      block_hits += warp_hits[w];
    }
    partials[blockIdx.x] = block_loss;
    partials[gridDim.x + blockIdx.x] = block_hits;
  }
}

// Pass 2, one block: strided per-thread sums, then a shared-memory tree.
__global__ void ReduceKernel(int64_t blocks, const double* partials, float* loss_sum,
                             float* correct) {
  __shared__ double loss[kThreadsPerBlock];
  __shared__ double hits[kThreadsPerBlock];
  double l = 0, h = 0;
  for (int64_t i = threadIdx.x; i < blocks; i += kThreadsPerBlock) {
    l += partials[i];
    h += partials[blocks + i];
  }
  loss[threadIdx.x] = l;
  hits[threadIdx.x] = h;
  __syncthreads();
  for (int stride = kThreadsPerBlock / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      loss[threadIdx.x] += loss[threadIdx.x + stride];
      hits[threadIdx.x] += hits[threadIdx.x + stride];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    *loss_sum = static_cast<float>(loss[0]);
    *correct = static_cast<float>(hits[0]);
  }
}

__global__ void ArgmaxKernel(int64_t batch, int64_t classes, const float* logits,
                             int32_t* predictions) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + warp; row < batch;
       row += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    float max;
    int32_t argmax;
    RowArgmax(logits + row * classes, classes, lane, &max, &argmax);
    if (lane == 0) predictions[row] = argmax;
  }
}

}  // namespace

int64_t SoftmaxCrossEntropyCudaScratchBytes(int64_t batch) {
  return 2 * RowBlocks(batch) * static_cast<int64_t>(sizeof(double));
}

cudaError_t SoftmaxCrossEntropyCuda(cudaStream_t stream, int64_t batch, int64_t classes,
                                    const float* logits, const int32_t* labels, float grad_scale,
                                    void* scratch, float* loss_sum, float* correct,
                                    float* dlogits) {
  // Launched even for batch == 0, so loss_sum and correct are still written.
  const int64_t blocks = RowBlocks(batch);
  double* partials = static_cast<double*>(scratch);
  RowsKernel<<<static_cast<unsigned int>(blocks), kThreadsPerBlock, 0, stream>>>(
      batch, classes, logits, labels, grad_scale, dlogits, partials);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  ReduceKernel<<<1, kThreadsPerBlock, 0, stream>>>(blocks, partials, loss_sum, correct);
  return cudaGetLastError();
}

cudaError_t ArgmaxRowsCuda(cudaStream_t stream, int64_t batch, int64_t classes, const float* logits,
                           int32_t* predictions) {
  if (batch == 0) return cudaSuccess;
  ArgmaxKernel<<<static_cast<unsigned int>(RowBlocks(batch)), kThreadsPerBlock, 0, stream>>>(
      batch, classes, logits, predictions);
  return cudaGetLastError();
}

}  // namespace ps::kernels::internal
