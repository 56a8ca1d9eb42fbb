#ifndef PS_KERNELS_GEMM_H_
#define PS_KERNELS_GEMM_H_

// Dense fp32 matrix multiply: OpenBLAS on CPU, cuBLAS on CUDA.
//
// All matrices are row-major and contiguous. op(A) is A or A^T, an m x k
// matrix; op(B) is k x n; C is m x n:
//   C = alpha * op(A) * op(B) + beta * C
// With beta == 0, C need not be initialised (NaNs in C are not propagated).
// On CUDA the work is queued on the device's stream. Errors: kInvalidArgument
// for negative sizes, kInternal for a cuBLAS failure, kUnimplemented for a
// CUDA device in a build without CUDA.

#include <cstdint>

#include "absl/status/status.h"
#include "common/device.h"

namespace ps::kernels {

absl::Status Gemm(Device& device, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                  float alpha, const float* a, const float* b, float beta, float* c);

// `batch` independent GEMMs with the same sizes; matrix i of A starts at
// a + i * stride_a (in elements), likewise B and C.
absl::Status GemmStridedBatched(Device& device, bool trans_a, bool trans_b, int64_t m, int64_t n,
                                int64_t k, float alpha, const float* a, int64_t stride_a,
                                const float* b, int64_t stride_b, float beta, float* c,
                                int64_t stride_c, int64_t batch);

// Sets how many threads OpenBLAS uses for one call (process-wide: OpenBLAS
// has no per-call setting). The trainer sets cores / D so that D CPU devices
// running concurrently do not oversubscribe the machine.
void SetBlasThreads(int threads);

}  // namespace ps::kernels

#endif  // PS_KERNELS_GEMM_H_
