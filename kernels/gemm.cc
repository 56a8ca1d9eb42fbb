#include "kernels/gemm.h"

#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/dispatch.h"

// OpenBLAS's run-time kernel selection in DYNAMIC_ARCH builds: exported by
// the library but declared in no header. Weak, so a build against an
// OpenBLAS without it still links (and SelectBlasCore does nothing).
extern "C" {
void gotoblas_dynamic_init(void) __attribute__((weak));
void gotoblas_dynamic_quit(void) __attribute__((weak));
}

namespace ps::kernels {
namespace {

// OpenBLAS and cuBLAS take 32-bit sizes and leading dimensions.
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
          PS_CUBLAS_RETURN_IF_ERROR(
              cublasSscal(device.cublas(), static_cast<int>(n), &beta, ci + r * n, 1));
        }
      }
    }
    return absl::OkStatus();
  }
  if (batch == 1) {
    PS_CUBLAS_RETURN_IF_ERROR(cublasSgemm(device.cublas(), op_b, op_a, static_cast<int>(n),
                                          static_cast<int>(m), static_cast<int>(k), &alpha, b, ldb,
                                          a, lda, &beta, c, ldc));
    return absl::OkStatus();
  }
  PS_CUBLAS_RETURN_IF_ERROR(cublasSgemmStridedBatched(
      device.cublas(), op_b, op_a, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
      &alpha, b, ldb, stride_b, a, lda, stride_a, &beta, c, ldc, stride_c,
      static_cast<int>(batch)));
  return absl::OkStatus();
}
#endif

}  // namespace

namespace internal {

void GemmCpu(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
             const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
             int64_t ldc) {
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

}  // namespace internal

absl::Status Gemm(Device& device, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                  float alpha, const float* a, const float* b, float beta, float* c) {
  PS_RETURN_IF_ERROR(CheckGemmArgs("Gemm", m, n, k, alpha, a, b, c));
  if (m == 0 || n == 0) return absl::OkStatus();
  if (device.is_cpu()) {
    internal::GemmCpu(trans_a, trans_b, m, n, k, alpha, a, Lda(trans_a, m, k), b,
                      Ldb(trans_b, n, k), beta, c, n);
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
    // OpenBLAS 0.3.21 has no batched GEMM; each call is threaded on its own.
    for (int64_t i = 0; i < batch; ++i) {
      internal::GemmCpu(trans_a, trans_b, m, n, k, alpha, a + i * stride_a, Lda(trans_a, m, k),
                        b + i * stride_b, Ldb(trans_b, n, k), beta, c + i * stride_c, n);
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

std::string BlasCoreName() {
  const char* name = openblas_get_corename();
  return name != nullptr ? name : "";
}

std::string SelectBlasCore() {
  // The user's (or the machine's) explicit choice stands.
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return BlasCoreName();
  const std::string core = BlasCoreName();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const char* wanted = nullptr;
  if (core == "Prescott") {
    // OpenBLAS's fallback: pick by features.
    if (__builtin_cpu_is("intel") && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")) {
      wanted = "SkylakeX";
    } else if (avx2) {
      wanted = "Haswell";
    }
  } else if (__builtin_cpu_is("amd") && avx2 &&
             (core == "SkylakeX" || core == "Cooperlake" || core == "SapphireRapids")) {
    wanted = "Haswell";  // see gemm.h
  }
  // Only DYNAMIC_ARCH builds (Debian's) can switch kernels at run time.
  if (wanted == nullptr || gotoblas_dynamic_init == nullptr || gotoblas_dynamic_quit == nullptr) {
    return core;
  }
  // OpenBLAS's one way to force a kernel set is OPENBLAS_CORETYPE, read by
  // its initialisation: set it (it was unset, see above) for the
  // re-initialisation only.
  setenv("OPENBLAS_CORETYPE", wanted, 1);
  gotoblas_dynamic_quit();
  gotoblas_dynamic_init();
  unsetenv("OPENBLAS_CORETYPE");
  return BlasCoreName();
}

void SetBlasThreads(int threads) {
  static std::once_flag select_core;
  std::call_once(select_core, [] { SelectBlasCore(); });
  openblas_set_num_threads(std::max(1, threads));
}

int BlasThreads() { return openblas_get_num_threads(); }

}  // namespace ps::kernels
