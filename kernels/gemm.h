#ifndef PS_KERNELS_GEMM_H_
#define PS_KERNELS_GEMM_H_

// Dense matrix multiply on fp32 matrices: oneDNN on CPU, cuBLAS on CUDA, in
// the device's gemm_precision() (fp32, or operands rounded to bf16 or fp16
// with fp32 accumulation: common/precision.h).
//
// On CPU, oneDNN's sgemm (the library PyTorch runs its convolutions on, JIT
// compiled for the CPU's widest vectors) rather than OpenBLAS: on this
// project's AMD Zen 4 machines it ran the MLP's and ResNet-18's GEMM shapes
// 1.3-2.6x faster than Debian's OpenBLAS 0.3.21 under the Haswell kernels
// those machines select (OPENBLAS_CORETYPE=Haswell, since OpenBLAS's
// AVX-512 kernels drift there); see the README's compute section.
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
#include "common/precision.h"

namespace ps::kernels {

absl::Status Gemm(Device& device, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                  float alpha, const float* a, const float* b, float beta, float* c);

// `batch` independent GEMMs with the same sizes; matrix i of A starts at
// a + i * stride_a (in elements), likewise B and C.
absl::Status GemmStridedBatched(Device& device, bool trans_a, bool trans_b, int64_t m, int64_t n,
                                int64_t k, float alpha, const float* a, int64_t stride_a,
                                const float* b, int64_t stride_b, float beta, float* c,
                                int64_t stride_c, int64_t batch);

// Sets how many threads one CPU GEMM may use (process-wide). The trainer
// sets cores / D so that D CPU devices running concurrently do not
// oversubscribe the machine. A GEMM called from a part of a
// CpuDevice::ParallelFor cut into several always runs on its caller's thread
// alone: the convolution and linear kernels split their work across a
// device's own threads that way when that pays, and otherwise make one GEMM
// call that these threads share (see conv_cpu.h and linear_cpu.h).
void SetBlasThreads(int threads);

// What SetBlasThreads last set (every core before the first call).
int BlasThreads();

// SetBlasThreads(threads) for the object's lifetime, then the count before
// (tests and benchmarks that try several).
class ScopedBlasThreads {
 public:
  explicit ScopedBlasThreads(int threads) : saved_(BlasThreads()) { SetBlasThreads(threads); }
  ~ScopedBlasThreads() { SetBlasThreads(saved_); }
  ScopedBlasThreads(const ScopedBlasThreads&) = delete;
  ScopedBlasThreads& operator=(const ScopedBlasThreads&) = delete;

 private:
  const int saved_;
};

namespace internal {

// C = alpha * op(A) * op(B) + beta * C on host memory, row-major with explicit
// leading dimensions (elements between rows), so CPU kernels can multiply
// sub-blocks of larger matrices without copying them. The caller has checked
// the sizes (non-negative, each below 2^31) and pointers. Runs on the calling
// thread plus BlasThreads() - 1 OpenMP threads, or on the calling thread
// alone inside a ParallelFor part (see SetBlasThreads).
// `precision` is the device's gemm_precision() (kBf16 and kFp16 run
// half_gemm_cpu.h's GEMM).
void GemmCpu(Precision precision, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
             float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
             float* c, int64_t ldc);

}  // namespace internal

}  // namespace ps::kernels

#endif  // PS_KERNELS_GEMM_H_
