#ifndef PS_KERNELS_LINEAR_CUDA_H_
#define PS_KERNELS_LINEAR_CUDA_H_

// CUDA launchers behind linear.h (the GEMMs are cuBLAS's, through gemm.h).
// Each queues one kernel on `stream` and returns the launch error
// (cudaSuccess when queued). Pointers are device memory of the GPU current
// on the calling thread; matrices are row-major.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ps::kernels::internal {

// Every row of the rows x cols matrix y becomes a copy of bias[0, cols).
cudaError_t BroadcastRowsCuda(cudaStream_t stream, int64_t rows, int64_t cols, const float* bias,
                              float* y);

// sums[c] = sum over r of m[r * cols + c] (overwrites sums). Deterministic:
// each column is summed by one thread block in a fixed order.
cudaError_t ColumnSumsCuda(cudaStream_t stream, int64_t rows, int64_t cols, const float* m,
                           float* sums);

}  // namespace ps::kernels::internal

#endif  // PS_KERNELS_LINEAR_CUDA_H_
