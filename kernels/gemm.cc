#include "kernels/gemm.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/cpu_device.h"
#include "common/status_macros.h"
#include "kernels/dispatch.h"
#include "kernels/half_gemm_cpu.h"

#ifdef PS_WITH_CUDA
#include "kernels/half_convert_cuda.h"
#endif
#include "oneapi/dnnl/dnnl.h"

namespace ps::kernels {
namespace {

// Threads a GEMM called outside a CpuDevice::ParallelFor part may use
// (SetBlasThreads). Until set: every core, as OpenMP's default would.
std::atomic<int>& GemmThreads() {
  static std::atomic<int> threads{
      static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))};
  return threads;
}

// oneDNN and cuBLAS take 32-bit sizes and leading dimensions.
absl::Status CheckBlasSize(const char* op, const char* what, int64_t value) {
  if (value < 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", what, " = ", value, " is negative"));
  }
  if (value > INT_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", what, " = ", value, " exceeds the BLAS limit of ", INT_MAX));
  }
  return absl::OkStatus();
}

absl::Status CheckGemmArgs(const char* op, int64_t m, int64_t n, int64_t k, float alpha,
                           const float* a, const float* b, const float* c) {
  PS_RETURN_IF_ERROR(CheckBlasSize(op, "m", m));
  PS_RETURN_IF_ERROR(CheckBlasSize(op, "n", n));
  PS_RETURN_IF_ERROR(CheckBlasSize(op, "k", k));
  if (m > 0 && n > 0) {
    if (c == nullptr) return absl::InvalidArgumentError(absl::StrCat(op, ": C is null"));
    if (k > 0 && alpha != 0 && (a == nullptr || b == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": A or B is null"));
    }
  }
  return absl::OkStatus();
}

// Leading dimensions of the row-major operands as stored. BLAS wants at
// least 1 even when a dimension is 0.
int64_t Lda(bool trans_a, int64_t m, int64_t k) { return std::max<int64_t>(1, trans_a ? m : k); }
int64_t Ldb(bool trans_b, int64_t n, int64_t k) { return std::max<int64_t>(1, trans_b ? k : n); }

#ifdef PS_WITH_CUDA
// cuBLAS is column-major. A row-major m x n matrix is its column-major
// transpose, so C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T: swap the
// operands and m with n, keep each operand's own transpose flag.
absl::Status GemmCuda(CudaDevice& device, bool trans_a, bool trans_b, int64_t m, int64_t n,
                      int64_t k, float alpha, const float* a, int64_t stride_a, const float* b,
                      int64_t stride_b, float beta, float* c, int64_t stride_c, int64_t batch) {
  PS_RETURN_IF_ERROR(device.MakeCurrent());
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int lda = static_cast<int>(Lda(trans_a, m, k));
  const int ldb = static_cast<int>(Ldb(trans_b, n, k));
  const int ldc = static_cast<int>(std::max<int64_t>(1, n));
  if (k == 0) {
    // C = beta * C, which BLAS defines for an empty product; spelled out so
    // as not to rely on cuBLAS's handling of k == 0. beta == 0 writes zeros
    // rather than scaling, so NaNs in C do not survive.
    for (int64_t i = 0; i < batch; ++i) {
      float* ci = c + i * stride_c;
      if (beta == 0.f) {
        PS_CUDA_RETURN_IF_ERROR(
            cudaMemsetAsync(ci, 0, m * n * static_cast<int64_t>(sizeof(float)), device.stream()));
      } else if (beta != 1.f) {
        for (int64_t r = 0; r < m; ++r) {
          PS_CUBLAS_RETURN_IF_ERROR(device.cublas_library().sscal(
              device.cublas(), static_cast<int>(n), &beta, ci + r * n, 1));
        }
      }
    }
    return absl::OkStatus();
  }
  if (device.gemm_precision() != Precision::kFp32) {
    // Round each operand, every matrix of the batch in one pass over its
    // span, into scratch slots 4 and 5; cuBLAS multiplies the 16-bit values
    // with fp32 accumulation into the fp32 C (common/precision.h).
    const bool bf16 = device.gemm_precision() == Precision::kBf16;
    const int64_t a_span = (batch - 1) * stride_a + m * k;
    const int64_t b_span = (batch - 1) * stride_b + k * n;
    PS_ASSIGN_OR_RETURN(void* a16, device.Scratch(4, a_span * 2));
    PS_ASSIGN_OR_RETURN(void* b16, device.Scratch(5, b_span * 2));
    const auto round = bf16 ? internal::RoundToBfloat16Cuda : internal::RoundToHalfCuda;
    PS_CUDA_RETURN_IF_ERROR(round(device.stream(), a_span, a, a16));
    PS_CUDA_RETURN_IF_ERROR(round(device.stream(), b_span, b, b16));
    const cudaDataType type = bf16 ? CUDA_R_16BF : CUDA_R_16F;
    PS_CUBLAS_RETURN_IF_ERROR(device.cublas_library().gemm_strided_batched_ex(
        device.cublas(), op_b, op_a, static_cast<int>(n), static_cast<int>(m),
        static_cast<int>(k), &alpha, b16, type, ldb, stride_b, a16, type, lda, stride_a, &beta, c,
        CUDA_R_32F, ldc, stride_c, static_cast<int>(batch), CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT));
    return absl::OkStatus();
  }
  if (batch == 1) {
    PS_CUBLAS_RETURN_IF_ERROR(device.cublas_library().sgemm(
        device.cublas(), op_b, op_a, static_cast<int>(n), static_cast<int>(m),
        static_cast<int>(k), &alpha, b, ldb, a, lda, &beta, c, ldc));
    return absl::OkStatus();
  }
  PS_CUBLAS_RETURN_IF_ERROR(device.cublas_library().sgemm_strided_batched(
      device.cublas(), op_b, op_a, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
      &alpha, b, ldb, stride_b, a, lda, stride_a, &beta, c, ldc, stride_c,
      static_cast<int>(batch)));
  return absl::OkStatus();
}
#endif

}  // namespace

namespace internal {

void GemmCpu(Precision precision, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
             float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
             float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0 || alpha == 0.f) {
    // C = beta * C: BLAS's result for an empty product, which dnnl_sgemm
    // refuses to compute, and for alpha == 0, where BLAS reads neither A nor
    // B (CheckGemmArgs lets them be null then). beta == 0 writes zeros, so
    // NaNs in C do not survive.
    for (int64_t i = 0; i < m; ++i) {
      float* row = c + i * ldc;
      if (beta == 0.f) {
        std::fill(row, row + n, 0.f);
      } else if (beta != 1.f) {
        for (int64_t j = 0; j < n; ++j) row[j] *= beta;
      }
    }
    return;
  }
  // oneDNN threads a GEMM over the calling thread's OpenMP team, whose size
  // is a per-thread setting: set it on every call, since any thread may call
  // (and conv_dnnl sets it to 1 for its primitives).
  const int threads =
      CpuDevice::InParallelPart() ? 1 : GemmThreads().load(std::memory_order_relaxed);
  if (omp_get_max_threads() != threads) omp_set_num_threads(threads);
  if (precision != Precision::kFp32) {
    HalfGemmCpu(precision, threads, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  const dnnl_status_t status =
      dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c,
                 ldc);
  if (status != dnnl_success) {
    // The callers checked every size and pointer (see CheckGemmArgs), which
    // is all dnnl_sgemm validates: a failure here is a bug, not bad input.
    std::fprintf(stderr, "dnnl_sgemm failed with status %d (m=%lld n=%lld k=%lld)\n",
                 static_cast<int>(status), static_cast<long long>(m), static_cast<long long>(n),
                 static_cast<long long>(k));
    std::abort();
  }
}

}  // namespace internal

absl::Status Gemm(Device& device, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                  float alpha, const float* a, const float* b, float beta, float* c) {
  PS_RETURN_IF_ERROR(CheckGemmArgs("Gemm", m, n, k, alpha, a, b, c));
  if (m == 0 || n == 0) return absl::OkStatus();
  if (device.is_cpu()) {
    internal::GemmCpu(device.gemm_precision(), trans_a, trans_b, m, n, k, alpha, a,
                      Lda(trans_a, m, k), b, Ldb(trans_b, n, k), beta, c, n);
    return absl::OkStatus();
  }
#ifdef PS_WITH_CUDA
  return GemmCuda(AsCuda(device), trans_a, trans_b, m, n, k, alpha, a, 0, b, 0, beta, c, 0, 1);
#else
  return absl::UnimplementedError("Gemm: CUDA device in a build without CUDA support");
#endif
}

absl::Status GemmStridedBatched(Device& device, bool trans_a, bool trans_b, int64_t m, int64_t n,
                                int64_t k, float alpha, const float* a, int64_t stride_a,
                                const float* b, int64_t stride_b, float beta, float* c,
                                int64_t stride_c, int64_t batch) {
  constexpr const char* kOp = "GemmStridedBatched";
  PS_RETURN_IF_ERROR(CheckGemmArgs(kOp, m, n, k, alpha, a, b, c));
  PS_RETURN_IF_ERROR(CheckBlasSize(kOp, "batch", batch));
  if (stride_a < 0 || stride_b < 0 || stride_c < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": negative stride (", stride_a, ", ", stride_b, ", ", stride_c, ")"));
  }
  // Overlapping outputs would make the result depend on execution order (and
  // race on a GPU). Inputs may overlap, e.g. stride 0 to share one matrix.
  if (batch > 1 && stride_c < m * n) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": stride_c = ", stride_c,
                                                   " is less than m * n = ", m * n,
                                                   ", so the outputs overlap"));
  }
  if (m == 0 || n == 0 || batch == 0) return absl::OkStatus();
  if (device.is_cpu()) {
    // Each matrix is one GEMM call, threaded on its own.
    for (int64_t i = 0; i < batch; ++i) {
      internal::GemmCpu(device.gemm_precision(), trans_a, trans_b, m, n, k, alpha, a + i * stride_a,
                        Lda(trans_a, m, k), b + i * stride_b, Ldb(trans_b, n, k), beta,
                        c + i * stride_c, n);
    }
    return absl::OkStatus();
  }
#ifdef PS_WITH_CUDA
  return GemmCuda(AsCuda(device), trans_a, trans_b, m, n, k, alpha, a, stride_a, b, stride_b, beta,
                  c, stride_c, batch);
#else
  return absl::UnimplementedError(
      "GemmStridedBatched: CUDA device in a build without CUDA support");
#endif
}

void SetBlasThreads(int threads) {
  GemmThreads().store(std::max(1, threads), std::memory_order_relaxed);
}

int BlasThreads() { return GemmThreads().load(std::memory_order_relaxed); }

}  // namespace ps::kernels
