#include "kernels/cuda_launch.cuh"
#include "kernels/linear_cuda.h"

namespace ps::kernels::internal {
namespace {

// Column sums: a block is 32 columns x 8 row lanes. Neighbouring threads read
// neighbouring columns of a row (coalesced); each lane sums every 8th row,
// then the 8 lanes are combined in shared memory.
constexpr int kSumCols = 32;
constexpr int kSumLanes = 8;

__global__ void BroadcastRowsKernel(int64_t rows, int64_t cols, const float* bias, float* y) {
  PS_GRID_STRIDE_LOOP(i, rows * cols) y[i] = bias[i % cols];
}

__global__ void ColumnSumsKernel(int64_t rows, int64_t cols, const float* m, float* sums) {
  __shared__ float partial[kSumLanes][kSumCols];
  const int64_t c = blockIdx.x * static_cast<int64_t>(kSumCols) + threadIdx.x;
  float sum = 0.f;
  if (c < cols) {
    for (int64_t r = threadIdx.y; r < rows; r += kSumLanes) sum += m[r * cols + c];
  }
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float total = 0.f;
    for (int lane = 0; lane < kSumLanes; ++lane) total += partial[lane][threadIdx.x];
    sums[c] = total;
  }
}

}  // namespace

cudaError_t BroadcastRowsCuda(cudaStream_t stream, int64_t rows, int64_t cols, const float* bias,
                              float* y) {
  const int64_t n = rows * cols;
  if (n == 0) return cudaSuccess;
  BroadcastRowsKernel<<<GridFor(n), kThreadsPerBlock, 0, stream>>>(rows, cols, bias, y);
  return cudaGetLastError();
}

cudaError_t ColumnSumsCuda(cudaStream_t stream, int64_t rows, int64_t cols, const float* m,
                           float* sums) {
  if (cols == 0) return cudaSuccess;
  const dim3 block(kSumCols, kSumLanes);
  const unsigned int grid = static_cast<unsigned int>((cols + kSumCols - 1) / kSumCols);
  ColumnSumsKernel<<<grid, block, 0, stream>>>(rows, cols, m, sums);
  return cudaGetLastError();
}

}  // namespace ps::kernels::internal
