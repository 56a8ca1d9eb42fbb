#ifndef PS_COMMON_CUDA_CHECK_H_
#define PS_COMMON_CUDA_CHECK_H_

// Turns CUDA runtime, cuBLAS and NCCL error codes into absl::Status. Include
// only from code built with PS_WITH_CUDA.

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/cublas_library.h"

namespace ps {

// Maps a CUDA runtime error to a status naming `what` (the call's text) and
// the runtime's message. Clears the thread's last error so a later call does
// not report this one again.
inline absl::Status CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();
  const absl::StatusCode code = err == cudaErrorMemoryAllocation
                                    ? absl::StatusCode::kResourceExhausted
                                    : absl::StatusCode::kInternal;
  return absl::Status(code, absl::StrCat(what, ": ", cudaGetErrorName(err), ": ",
                                         cudaGetErrorString(err)));
}

// cuBLAS's names for its codes come from the loaded library (a cuBLAS call
// returned this code, so it is loaded; the number alone if not).
inline absl::Status CublasStatus(cublasStatus_t err, const char* what) {
  if (err == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const CublasLibrary* cublas = CublasIfLoaded();
  if (cublas == nullptr) {
    return absl::InternalError(absl::StrCat(what, ": cuBLAS status ", static_cast<int>(err)));
  }
  return absl::InternalError(
      absl::StrCat(what, ": ", cublas->status_name(err), ": ", cublas->status_string(err)));
}

// Maps an NCCL error to a status naming `what`, NCCL's message for the code
// and NCCL's last-error detail when it has one. An NCCL call that failed in
// CUDA may leave the runtime's last error set; it is cleared here, as in
// CudaStatus. Code that uses this links @local_cuda//:nccl.
inline absl::Status NcclStatus(ncclResult_t err, const char* what) {
  if (err == ncclSuccess) return absl::OkStatus();
  cudaGetLastError();
  std::string message = absl::StrCat(what, ": ", ncclGetErrorString(err));
  const char* detail = ncclGetLastError(nullptr);
  if (detail != nullptr && detail[0] != '\0') absl::StrAppend(&message, " (", detail, ")");
  return absl::InternalError(message);
}

}  // namespace ps

#define PS_CUDA_RETURN_IF_ERROR(call)                                       \
  do {                                                                      \
    ::absl::Status ps_cuda_status_ = ::ps::CudaStatus((call), #call);       \
    if (!ps_cuda_status_.ok()) return ps_cuda_status_;                      \
  } while (false)

#define PS_CUBLAS_RETURN_IF_ERROR(call)                                     \
  do {                                                                      \
    ::absl::Status ps_cublas_status_ = ::ps::CublasStatus((call), #call);   \
    if (!ps_cublas_status_.ok()) return ps_cublas_status_;                  \
  } while (false)

#define PS_NCCL_RETURN_IF_ERROR(call)                                       \
  do {                                                                      \
    ::absl::Status ps_nccl_status_ = ::ps::NcclStatus((call), #call);       \
    if (!ps_nccl_status_.ok()) return ps_nccl_status_;                      \
  } while (false)

#endif  // PS_COMMON_CUDA_CHECK_H_
