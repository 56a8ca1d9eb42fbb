#ifndef PS_KERNELS_HALF_GEMM_CPU_H_
#define PS_KERNELS_HALF_GEMM_CPU_H_

// The CPU GEMM in half precision (common/precision.h): what internal::GemmCpu
// runs for a device whose gemm_precision() is kBf16 or kFp16.
//
// 1. Each operand is rounded, as stored, into a packed buffer of the calling
//    thread (reused from call to call): to bfloat16 for kBf16, to fp16 and
//    back to fp32 for kFp16. Rounding is to nearest, ties to even, by the
//    CPU's converters where it has them (AVX512-BF16's vcvtneps2bf16, F16C's
//    vcvtps2ph) and by common/half.h otherwise. The bf16 converter flushes
//    fp32 subnormals (below 1.2e-38) to zero, as the GPU's does not; nothing
//    the trainer multiplies is that small.
// 2. kBf16 multiplies the bf16 operands with oneDNN's matmul primitive,
//    accumulating in fp32 (AVX512-BF16's dot products, about 1.8x the fp32
//    rate on this project's CPUs), into the fp32 C with alpha and beta. On a
//    CPU without AVX-512 oneDNN 2.6 has no bf16 matmul; there the bf16
//    operands, widened to fp32 exactly, go to the fp32 GEMM (products of
//    8-bit significands are exact in fp32: the same values, summed in
//    another order), at about the fp32 rate less the rounding pass.
//    kFp16 multiplies the rounded fp32 copies with dnnl_sgemm: products of
//    11-bit significands are exact in fp32, so this is fp16 storage with
//    fp32 arithmetic, and slower than fp32 (the rounding pass; x86 has no
//    fp16 dot product before AVX512-FP16). It exists so that fp16 training,
//    its overflows and its loss scaling, run and are tested on CPUs too.
//
// Same contract as internal::GemmCpu (gemm.h): row-major operands with
// leading dimensions, sizes already checked, m, n, k > 0. `threads` is the
// calling thread's OpenMP team size, which GemmCpu has set (a bf16 primitive
// is made for its team). Thread-safe.

#include <cstdint>

#include "common/precision.h"

namespace ps::kernels::internal {

void HalfGemmCpu(Precision precision, int threads, bool trans_a, bool trans_b, int64_t m, int64_t n,
                 int64_t k, float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
                 float beta, float* c, int64_t ldc);

// Rounds rows x cols floats (row r at src + r * ld) to bfloat16, packed
// (row r at dst + r * cols); exposed for the tests.
void RoundToBfloat16(const float* src, int64_t rows, int64_t cols, int64_t ld, uint16_t* dst);

// Rounds them to the nearest fp16 value, kept as fp32, packed likewise.
void RoundToHalf(const float* src, int64_t rows, int64_t cols, int64_t ld, float* dst);

}  // namespace ps::kernels::internal

#endif  // PS_KERNELS_HALF_GEMM_CPU_H_
