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
#include <string>

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
// running concurrently do not oversubscribe the machine. The first call also
// runs SelectBlasCore(), so call it from main() before any BLAS work starts.
//
// The convolution and linear kernels split their work across a CpuDevice's
// own threads when their GEMMs then stay single-threaded (concurrent
// multi-threaded OpenBLAS calls spin against each other): always with
// SetBlasThreads(1); with more BLAS threads, convolution does so when it can
// cut its GEMMs below OpenBLAS's threading threshold, linear never (it then
// lets BLAS thread each GEMM). See conv_cpu.h and linear_cpu.h.
void SetBlasThreads(int threads);

// The number of threads OpenBLAS currently uses for one call (what the last
// SetBlasThreads set, or OpenBLAS's default of all cores).
int BlasThreads();

// Makes OpenBLAS use the fastest kernels this CPU runs, and returns the name
// of the kernel set in use afterwards ("SkylakeX", "Haswell", ...).
//
// OpenBLAS picks its kernels by CPU model when it loads, and 0.3.21 (Debian
// 12) does not know models newer than about 2021 (Sapphire and Emerald
// Rapids among them): it falls back to its SSE3 "Prescott" kernels, which run
// SGEMM 5-6x slower than its AVX-512 ones on the same core. When that has
// happened this re-selects by the CPU's features (AVX-512 on Intel ->
// SkylakeX, AVX2 and FMA -> Haswell). On AMD processors with AVX-512 (Zen 4)
// it picks Cooperlake's AVX-512 kernels, which such machines' administrators
// steer away from (OPENBLAS_CORETYPE=Haswell) and under which our ResNet-18
// three-step parity with PyTorch drifts 28 tolerances (Haswell: 0.2); so
// there too it selects Haswell, which Zen 4 runs at the same width. A set
// OPENBLAS_CORETYPE is always left alone. Process-wide, and not safe while
// any thread is inside a BLAS call: call it (or SetBlasThreads) from main()
// first. Idempotent.
std::string SelectBlasCore();

// The OpenBLAS kernel set in use, e.g. "SkylakeX" or "Prescott".
std::string BlasCoreName();

namespace internal {

// C = alpha * op(A) * op(B) + beta * C on host memory, row-major with explicit
// leading dimensions (elements between rows), so CPU kernels can multiply
// sub-blocks of larger matrices without copying them. The caller has checked
// the sizes (non-negative, each below 2^31) and pointers. Runs on the calling
// thread plus OpenBLAS's own threads (see SetBlasThreads).
void GemmCpu(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
             const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
             int64_t ldc);

}  // namespace internal

}  // namespace ps::kernels

#endif  // PS_KERNELS_GEMM_H_
