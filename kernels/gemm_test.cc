#include "kernels/gemm.h"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "common/cpu_device.h"
#include "common/half.h"
#include "kernels/half_gemm_cpu.h"
#include "kernels/test_util.h"

namespace ps::kernels {
namespace {

using testing::AllClose;
using testing::DeviceBuffer;
using testing::RandomVector;

// C = alpha * op(A) op(B) + beta * C by the definition, in double; beta == 0
// ignores C's old contents.
std::vector<float> ReferenceGemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                                 float alpha, const std::vector<float>& a,
                                 const std::vector<float>& b, float beta,
                                 const std::vector<float>& c) {
  std::vector<float> out(m * n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double av = trans_a ? a[p * m + i] : a[i * k + p];
        const double bv = trans_b ? b[j * k + p] : b[p * n + j];
        sum += av * bv;
      }
      const double old = beta == 0 ? 0.0 : beta * double(c[i * n + j]);
      out[i * n + j] = static_cast<float>(alpha * sum + old);
    }
  }
  return out;
}

struct GemmCase {
  int64_t m, n, k;
  float alpha, beta;
};

// Square, skinny, wide, odd and degenerate sizes, with and without beta.
const GemmCase kCases[] = {
    {1, 1, 1, 1.f, 0.f},     {3, 5, 7, 1.f, 0.f},       {17, 33, 9, 0.5f, -1.5f},
    {64, 1, 128, 1.f, 1.f},  {1, 100, 3, 2.f, 0.f},     {128, 96, 200, 1.f, 0.25f},
    {6, 3136, 25, 1.f, 0.f}, {16, 150, 1200, 1.f, 1.f}, {65, 67, 63, -1.f, 0.5f},
};

TEST(GemmCpuTest, MatchesReferenceForEveryTransposeAndShape) {
  CpuDevice cpu(0, 1);
  uint64_t seed = 1;
  for (const GemmCase& cs : kCases) {
    for (bool trans_a : {false, true}) {
      for (bool trans_b : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << "m=" << cs.m << " n=" << cs.n << " k=" << cs.k << " trans_a=" << trans_a
                     << " trans_b=" << trans_b << " alpha=" << cs.alpha << " beta=" << cs.beta);
        const auto a = RandomVector(cs.m * cs.k, seed++);
        const auto b = RandomVector(cs.k * cs.n, seed++);
        auto c = RandomVector(cs.m * cs.n, seed++);
        const auto expected =
            ReferenceGemm(trans_a, trans_b, cs.m, cs.n, cs.k, cs.alpha, a, b, cs.beta, c);
        ASSERT_TRUE(Gemm(cpu, trans_a, trans_b, cs.m, cs.n, cs.k, cs.alpha, a.data(), b.data(),
                         cs.beta, c.data())
                        .ok());
        EXPECT_TRUE(AllClose(c, expected, 1e-4f, 1e-4f));
      }
    }
  }
}

TEST(GemmCpuTest, BetaZeroIgnoresNansInC) {
  CpuDevice cpu(0, 1);
  const auto a = RandomVector(4 * 6, 1), b = RandomVector(6 * 5, 2);
  std::vector<float> c(4 * 5, std::numeric_limits<float>::quiet_NaN());
  ASSERT_TRUE(Gemm(cpu, false, false, 4, 5, 6, 1.f, a.data(), b.data(), 0.f, c.data()).ok());
  EXPECT_TRUE(AllClose(c, ReferenceGemm(false, false, 4, 5, 6, 1.f, a, b, 0.f, c), 1e-5f, 1e-5f));
}

TEST(GemmCpuTest, EmptyProductScalesC) {
  CpuDevice cpu(0, 1);
  std::vector<float> c = {1, 2, 3, 4, 5, 6};
  ASSERT_TRUE(Gemm(cpu, false, false, 2, 3, 0, 1.f, nullptr, nullptr, 2.f, c.data()).ok());
  EXPECT_TRUE(AllClose(c, {2, 4, 6, 8, 10, 12}, 0, 0));
  std::fill(c.begin(), c.end(), std::numeric_limits<float>::quiet_NaN());
  ASSERT_TRUE(Gemm(cpu, true, true, 2, 3, 0, 1.f, nullptr, nullptr, 0.f, c.data()).ok());
  EXPECT_TRUE(AllClose(c, std::vector<float>(6, 0.f), 0, 0));
  // An empty C is a no-op, whatever the pointers.
  EXPECT_TRUE(Gemm(cpu, false, false, 0, 3, 4, 1.f, nullptr, nullptr, 0.f, nullptr).ok());
  // alpha == 0 reads neither A nor B, as in BLAS.
  std::fill(c.begin(), c.end(), 1.f);
  ASSERT_TRUE(Gemm(cpu, false, false, 2, 3, 4, 0.f, nullptr, nullptr, 3.f, c.data()).ok());
  EXPECT_TRUE(AllClose(c, std::vector<float>(6, 3.f), 0, 0));
}

TEST(GemmCpuTest, StridedBatchedMatchesPerMatrixReference) {
  CpuDevice cpu(0, 1);
  const int64_t m = 7, n = 9, k = 5, batch = 4;
  // A is shared by every matrix (stride 0); C has a gap between matrices.
  const int64_t stride_b = k * n + 3, stride_c = m * n + 2;
  const auto a = RandomVector(m * k, 1);
  const auto b = RandomVector(stride_b * batch, 2);
  auto c = RandomVector(stride_c * batch, 3);
  std::vector<float> expected = c;
  for (int64_t i = 0; i < batch; ++i) {
    const std::vector<float> bi(b.begin() + i * stride_b, b.begin() + i * stride_b + k * n);
    const std::vector<float> ci(c.begin() + i * stride_c, c.begin() + i * stride_c + m * n);
    const auto ref = ReferenceGemm(true, false, m, n, k, 1.5f, a, bi, 0.5f, ci);
    std::copy(ref.begin(), ref.end(), expected.begin() + i * stride_c);
  }
  ASSERT_TRUE(GemmStridedBatched(cpu, true, false, m, n, k, 1.5f, a.data(), 0, b.data(), stride_b,
                                 0.5f, c.data(), stride_c, batch)
                  .ok());
  EXPECT_TRUE(AllClose(c, expected, 1e-5f, 1e-5f));
}

TEST(GemmCpuTest, RejectsBadSizes) {
  CpuDevice cpu(0, 1);
  std::vector<float> buf(64);
  float* p = buf.data();
  EXPECT_EQ(Gemm(cpu, false, false, -1, 2, 2, 1.f, p, p, 0.f, p).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Gemm(cpu, false, false, 2, -1, 2, 1.f, p, p, 0.f, p).code(),
            absl::StatusCode::kInvalidArgument);
  const absl::Status negative_k = Gemm(cpu, false, false, 2, 2, -3, 1.f, p, p, 0.f, p);
  EXPECT_EQ(negative_k.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(negative_k.message().find("k = -3"), absl::string_view::npos) << negative_k;
  EXPECT_EQ(Gemm(cpu, false, false, int64_t{1} << 31, 1, 1, 1.f, p, p, 0.f, p).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Gemm(cpu, false, false, 2, 2, 2, 1.f, nullptr, p, 0.f, p).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GemmStridedBatched(cpu, false, false, 2, 2, 2, 1.f, p, 4, p, 4, 0.f, p, 4, -1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GemmStridedBatched(cpu, false, false, 2, 2, 2, 1.f, p, -4, p, 4, 0.f, p, 4, 2).code(),
            absl::StatusCode::kInvalidArgument);
  // Outputs 3 elements apart would overlap 2 x 2 matrices.
  EXPECT_EQ(GemmStridedBatched(cpu, false, false, 2, 2, 2, 1.f, p, 4, p, 4, 0.f, p, 3, 2).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GemmCpuTest, BlasThreadsRoundTrip) {
  const int before = BlasThreads();
  {
    const ScopedBlasThreads one(1);
    EXPECT_EQ(BlasThreads(), 1);
    SetBlasThreads(0);  // clamped to 1
    EXPECT_EQ(BlasThreads(), 1);
  }
  EXPECT_EQ(BlasThreads(), before);
}

// Threaded GEMMs, and GEMMs made concurrently from the parts of a split
// loop (which run single-threaded), give the reference result.
TEST(GemmCpuTest, MatchesReferenceThreadedAndFromParallelParts) {
  const ScopedBlasThreads blas(2);
  CpuDevice cpu(0, 2);
  const GemmCase cs = {128, 96, 200, 1.f, 0.25f};
  const auto a = RandomVector(cs.m * cs.k, 11), b = RandomVector(cs.k * cs.n, 12);
  const auto c0 = RandomVector(cs.m * cs.n, 13);
  const auto expected = ReferenceGemm(false, true, cs.m, cs.n, cs.k, cs.alpha, a, b, cs.beta, c0);
  auto c = c0;
  ASSERT_TRUE(
      Gemm(cpu, false, true, cs.m, cs.n, cs.k, cs.alpha, a.data(), b.data(), cs.beta, c.data())
          .ok());
  EXPECT_TRUE(AllClose(c, expected, 1e-4f, 1e-4f));
  std::vector<std::vector<float>> outs(4, c0);
  cpu.ParallelFor(4, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      internal::GemmCpu(Precision::kFp32, false, true, cs.m, cs.n, cs.k, cs.alpha, a.data(),
                        cs.k, b.data(), cs.k, cs.beta, outs[i].data(), cs.n);
    }
  });
  for (const auto& out : outs) EXPECT_TRUE(AllClose(out, expected, 1e-4f, 1e-4f));
}

// Each element rounded through the precision's 16-bit format, by common/half.h.
std::vector<float> Rounded(Precision precision, std::vector<float> v) {
  for (float& x : v) {
    x = precision == Precision::kBf16 ? Bfloat16ToFloat(FloatToBfloat16(x))
                                      : HalfToFloat(FloatToHalf(x));
  }
  return v;
}

// A half-precision GEMM is the exact product of the rounded operands up to
// fp32 accumulation, for every shape, transpose, alpha and beta, threaded
// or not; and it does round (it is not the fp32 product).
TEST(GemmCpuTest, HalfPrecisionMultipliesRoundedOperandsInFp32) {
  for (Precision precision : {Precision::kBf16, Precision::kFp16}) {
    for (int threads : {1, 2}) {
      const ScopedBlasThreads blas(threads);
      CpuDevice cpu(0, threads);
      cpu.set_gemm_precision(precision);
      uint64_t seed = 200;
      for (const GemmCase& cs : kCases) {
        for (bool trans_a : {false, true}) {
          for (bool trans_b : {false, true}) {
            SCOPED_TRACE(::testing::Message()
                         << PrecisionName(precision) << " threads=" << threads << " m=" << cs.m
                         << " n=" << cs.n << " k=" << cs.k << " trans_a=" << trans_a
                         << " trans_b=" << trans_b);
            const auto a = RandomVector(cs.m * cs.k, seed++);
            const auto b = RandomVector(cs.k * cs.n, seed++);
            auto c = RandomVector(cs.m * cs.n, seed++);
            const auto expected = ReferenceGemm(trans_a, trans_b, cs.m, cs.n, cs.k, cs.alpha,
                                                Rounded(precision, a), Rounded(precision, b),
                                                cs.beta, c);
            const auto unrounded =
                ReferenceGemm(trans_a, trans_b, cs.m, cs.n, cs.k, cs.alpha, a, b, cs.beta, c);
            ASSERT_TRUE(Gemm(cpu, trans_a, trans_b, cs.m, cs.n, cs.k, cs.alpha, a.data(),
                             b.data(), cs.beta, c.data())
                            .ok());
            EXPECT_TRUE(AllClose(c, expected, 1e-4f, 1e-4f));
            if (cs.k >= 7) {
              EXPECT_FALSE(AllClose(c, unrounded, 1e-5f, 1e-5f));
            }
          }
        }
      }
    }
  }
}

// fp16's largest finite value is 65504: a larger operand is infinity, and so
// is every product it enters (what loss scaling detects). bf16 has fp32's
// range.
TEST(GemmCpuTest, Fp16OperandsOverflowToInfinity) {
  CpuDevice cpu(0, 1);
  const std::vector<float> a = {70000.f, 1.f, 2.f, 3.f}, b = {1.f, 1.f, 1.f, 1.f};
  std::vector<float> c(4);
  cpu.set_gemm_precision(Precision::kFp16);
  ASSERT_TRUE(Gemm(cpu, false, false, 2, 2, 2, 1.f, a.data(), b.data(), 0.f, c.data()).ok());
  EXPECT_TRUE(std::isinf(c[0]) && std::isinf(c[1]));
  EXPECT_EQ(c[2], 5.f);
  cpu.set_gemm_precision(Precision::kBf16);
  ASSERT_TRUE(Gemm(cpu, false, false, 2, 2, 2, 1.f, a.data(), b.data(), 0.f, c.data()).ok());
  EXPECT_EQ(c[0], Bfloat16ToFloat(FloatToBfloat16(70000.f)) + 1.f);
}

// The vector converters round as common/half.h does (ties to even, infinity,
// NaN, rows packed from a larger leading dimension).
TEST(HalfRoundingTest, MatchesCommonHalfIncludingTiesAndSpecials) {
  std::vector<float> src = RandomVector(3 * 37, 7);
  for (float& x : src) x *= 1000.f;
  src[0] = 1.00390625f;  // a bf16 tie: to even, 1.0
  src[1] = 1.0f + 1.5f * 0.0078125f;  // a bf16 tie: up
  src[2] = std::numeric_limits<float>::infinity();
  src[3] = -std::numeric_limits<float>::quiet_NaN();
  src[4] = 65520.f;  // halfway past fp16's largest: infinity
  src[5] = 1e-5f;  // an fp16 subnormal
  const int64_t rows = 3, cols = 33, ld = 37;
  std::vector<uint16_t> bf16(rows * cols);
  std::vector<float> half(rows * cols);
  internal::RoundToBfloat16(src.data(), rows, cols, ld, bf16.data());
  internal::RoundToHalf(src.data(), rows, cols, ld, half.data());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < cols; ++j) {
      const float x = src[r * ld + j];
      SCOPED_TRACE(::testing::Message() << "element " << r << "," << j << " = " << x);
      if (std::isnan(x)) {
        EXPECT_TRUE(std::isnan(Bfloat16ToFloat(bf16[r * cols + j])));
        EXPECT_TRUE(std::isnan(half[r * cols + j]));
        continue;
      }
      EXPECT_EQ(bf16[r * cols + j], FloatToBfloat16(x));
      EXPECT_EQ(half[r * cols + j], HalfToFloat(FloatToHalf(x)));
    }
  }
  EXPECT_EQ(Bfloat16ToFloat(bf16[0]), 1.f);
  EXPECT_TRUE(std::isinf(half[4]));
}

// Every case, transpose and a shared-A batch on `gpu` against `cpu`, in the
// precision each device is set to: the same results within fp32
// accumulation's order.
void ExpectGpuMatchesCpu(Device* gpu, CpuDevice& cpu, uint64_t seed) {
  for (const GemmCase& cs : kCases) {
    for (bool trans_a : {false, true}) {
      for (bool trans_b : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << PrecisionName(gpu->gemm_precision()) << " m=" << cs.m << " n=" << cs.n
                     << " k=" << cs.k << " trans_a=" << trans_a << " trans_b=" << trans_b);
        const auto a = RandomVector(cs.m * cs.k, seed++);
        const auto b = RandomVector(cs.k * cs.n, seed++);
        auto c = RandomVector(cs.m * cs.n, seed++);
        DeviceBuffer ga(gpu, a), gb(gpu, b), gc(gpu, c);
        ASSERT_TRUE(Gemm(cpu, trans_a, trans_b, cs.m, cs.n, cs.k, cs.alpha, a.data(), b.data(),
                         cs.beta, c.data())
                        .ok());
        ASSERT_TRUE(Gemm(*gpu, trans_a, trans_b, cs.m, cs.n, cs.k, cs.alpha, ga.data(), gb.data(),
                         cs.beta, gc.data())
                        .ok());
        EXPECT_TRUE(AllClose(gc.ToHost(), c, 1e-4f, 1e-4f));
      }
    }
  }
  // Batched, with a shared A.
  const int64_t m = 7, n = 9, k = 5, batch = 4, stride_b = k * n + 3, stride_c = m * n + 2;
  const auto a = RandomVector(m * k, seed++), b = RandomVector(stride_b * batch, seed++);
  auto c = RandomVector(stride_c * batch, seed++);
  DeviceBuffer ga(gpu, a), gb(gpu, b), gc(gpu, c);
  ASSERT_TRUE(GemmStridedBatched(cpu, false, true, m, n, k, 1.5f, a.data(), 0, b.data(), stride_b,
                                 0.5f, c.data(), stride_c, batch)
                  .ok());
  ASSERT_TRUE(GemmStridedBatched(*gpu, false, true, m, n, k, 1.5f, ga.data(), 0, gb.data(),
                                 stride_b, 0.5f, gc.data(), stride_c, batch)
                  .ok());
  EXPECT_TRUE(AllClose(gc.ToHost(), c, 1e-5f, 1e-5f));
}

TEST(GemmCudaTest, MatchesCpu) {
  PS_SKIP_WITHOUT_GPU();
  Device* gpu = testing::TestGpu();
  CpuDevice cpu(0, 1);
  ExpectGpuMatchesCpu(gpu, cpu, 100);

  // The empty product.
  std::vector<float> scaled = {1, 2, 3, 4, 5, 6};
  DeviceBuffer gs(gpu, scaled);
  ASSERT_TRUE(Gemm(*gpu, false, false, 2, 3, 0, 1.f, nullptr, nullptr, -2.f, gs.data()).ok());
  EXPECT_TRUE(AllClose(gs.ToHost(), {-2, -4, -6, -8, -10, -12}, 0, 0));
  ASSERT_TRUE(Gemm(*gpu, false, false, 2, 3, 0, 1.f, nullptr, nullptr, 0.f, gs.data()).ok());
  EXPECT_TRUE(AllClose(gs.ToHost(), std::vector<float>(6, 0.f), 0, 0));

  EXPECT_EQ(Gemm(*gpu, false, false, -1, 2, 2, 1.f, gs.data(), gs.data(), 0.f, gs.data()).code(),
            absl::StatusCode::kInvalidArgument);
}

// The GPU's half-precision GEMMs (cuBLAS on rounded operands) against the
// CPU's, in one test body: the same rounding, fp32 accumulation in another
// order.
TEST(GemmCudaTest, HalfPrecisionMatchesCpu) {
  PS_SKIP_WITHOUT_GPU();
  Device* gpu = testing::TestGpu();
  CpuDevice cpu(0, 1);
  for (Precision precision : {Precision::kBf16, Precision::kFp16}) {
    cpu.set_gemm_precision(precision);
    gpu->set_gemm_precision(precision);
    ExpectGpuMatchesCpu(gpu, cpu, 300);
  }
  gpu->set_gemm_precision(Precision::kFp32);
}

}  // namespace
}  // namespace ps::kernels
