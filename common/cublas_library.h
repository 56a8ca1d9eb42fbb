#ifndef PS_COMMON_CUBLAS_LIBRARY_H_
#define PS_COMMON_CUBLAS_LIBRARY_H_

// cuBLAS, loaded (dlopen) when the first CUDA device is created instead of
// at program start.
//
// Why: loading libcublas and libcublasLt (CUDA 13) makes 154 MB resident
// before main() runs (a program linking them and doing nothing else: 155 MB
// of ru_maxrss against 1.5 MB; cudart 1.5 MB, NCCL 3.7 MB), and a worker
// built with CUDA paid that on every CPU-only run: LeNet's training process
// peaked at 277 MB against 117 MB in the CPU-only build. cuBLAS is the only
// CUDA library of that weight here, so it alone is loaded on demand; cudart
// and NCCL stay linked.
//
// The table holds the few entry points the project calls, under cuBLAS's own
// signatures (cublas_v2.h's names map to the _v2 symbols looked up here).

#include <cublas_v2.h>

#include "absl/status/statusor.h"

namespace ps {

struct CublasLibrary {
  decltype(&cublasCreate_v2) create;
  decltype(&cublasDestroy_v2) destroy;
  decltype(&cublasSetStream_v2) set_stream;
  decltype(&cublasSgemm_v2) sgemm;
  decltype(&cublasSgemmStridedBatched) sgemm_strided_batched;
  // The half-precision GEMMs. Spelled out: C++ sees an inline overload too.
  cublasStatus_t (*gemm_strided_batched_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t,
                                            int m, int n, int k, const void* alpha, const void* a,
                                            cudaDataType a_type, int lda, long long stride_a,
                                            const void* b, cudaDataType b_type, int ldb,
                                            long long stride_b, const void* beta, void* c,
                                            cudaDataType c_type, int ldc, long long stride_c,
                                            int batch, cublasComputeType_t compute,
                                            cublasGemmAlgo_t algo);
  decltype(&cublasSscal_v2) sscal;
  decltype(&cublasGetStatusName) status_name;
  decltype(&cublasGetStatusString) status_string;
};

// The process's cuBLAS (libcublas.so.<the major version compiled against>,
// found as the dynamic loader finds libraries: RUNPATH, LD_LIBRARY_PATH, the
// loader's --library-path). Loaded once, on the first call, thread-safely;
// every later call returns the same table or the same error.
// kFailedPrecondition names the library and dlerror()'s reason when it
// cannot be loaded or lacks an entry point.
absl::StatusOr<const CublasLibrary*> Cublas();

// The table if Cublas() has loaded it, else null (for error messages, which
// must not load a library themselves).
const CublasLibrary* CublasIfLoaded();

}  // namespace ps

#endif  // PS_COMMON_CUBLAS_LIBRARY_H_
