#ifndef PS_COMMON_DTYPE_H_
#define PS_COMMON_DTYPE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ps {

// Element types. Training computes in fp32 today; fp16 and bf16 exist so the
// wire, the weights files and, later, mixed precision can name them.
enum class DType : int32_t {
  kF32 = 0,
  kF16 = 1,
  kBF16 = 2,
  kI32 = 3,  // labels, argmax indices
  kI64 = 4,  // PyTorch's num_batches_tracked in weights files
};

// Bytes per element.
int64_t DTypeSize(DType dtype);

// "F32", "F16", "BF16", "I32", "I64": the safetensors spelling.
absl::string_view DTypeName(DType dtype);

// Inverse of DTypeName; kInvalidArgument names the unknown string.
absl::StatusOr<DType> DTypeFromName(absl::string_view name);

}  // namespace ps

#endif  // PS_COMMON_DTYPE_H_
