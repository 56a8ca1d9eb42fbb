#include "common/cublas_library.h"

#include <dlfcn.h>

#include <atomic>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ps {
namespace {

std::atomic<const CublasLibrary*> loaded{nullptr};

// Resolves `name` in `handle` into *fn; false (and *error set) if missing.
template <typename Fn>
bool Resolve(void* handle, const char* name, Fn* fn, std::string* error) {
  dlerror();
  *fn = reinterpret_cast<Fn>(dlsym(handle, name));
  if (*fn != nullptr) return true;
  const char* why = dlerror();
  *error = absl::StrCat(name, ": ", why != nullptr ? why : "not found");
  return false;
}

absl::StatusOr<const CublasLibrary*> Load() {
  const std::string library = absl::StrCat("libcublas.so.", CUBLAS_VER_MAJOR);
  // Never closed: the table lives as long as the process.
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    return absl::FailedPreconditionError(
        absl::StrCat("cannot load cuBLAS (", library, "): ", why != nullptr ? why : "unknown"));
  }
  auto* table = new CublasLibrary;
  std::string error;
  if (!Resolve(handle, "cublasCreate_v2", &table->create, &error) ||
      !Resolve(handle, "cublasDestroy_v2", &table->destroy, &error) ||
      !Resolve(handle, "cublasSetStream_v2", &table->set_stream, &error) ||
      !Resolve(handle, "cublasSgemm_v2", &table->sgemm, &error) ||
      !Resolve(handle, "cublasSgemmStridedBatched", &table->sgemm_strided_batched, &error) ||
      !Resolve(handle, "cublasGemmStridedBatchedEx", &table->gemm_strided_batched_ex, &error) ||
      !Resolve(handle, "cublasSscal_v2", &table->sscal, &error) ||
      !Resolve(handle, "cublasGetStatusName", &table->status_name, &error) ||
      !Resolve(handle, "cublasGetStatusString", &table->status_string, &error)) {
    delete table;
    return absl::FailedPreconditionError(
        absl::StrCat(library, " lacks an entry point the project calls: ", error));
  }
  loaded.store(table, std::memory_order_release);
  return table;
}

}  // namespace

absl::StatusOr<const CublasLibrary*> Cublas() {
  // Initialised by the first call, once, thread-safely; never destroyed.
  static const auto* const result = new absl::StatusOr<const CublasLibrary*>(Load());
  return *result;
}

const CublasLibrary* CublasIfLoaded() { return loaded.load(std::memory_order_acquire); }

}  // namespace ps
