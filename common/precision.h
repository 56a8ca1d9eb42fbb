#ifndef PS_COMMON_PRECISION_H_
#define PS_COMMON_PRECISION_H_

// The precision a device's matrix multiplies run in (`--precision`): mixed
// precision as PyTorch's autocast does it for GEMMs, and cuBLAS's math mode.
//
//   kFp32  operands and arithmetic in fp32 (the default; the core promise's
//          exact path).
//   kBf16  the GEMM's operands rounded to bfloat16 (8 significant bits),
//          products accumulated in fp32, the result fp32.
//   kFp16  the operands rounded to IEEE binary16 (11 significant bits, largest
//          finite 65504), fp32 accumulation and result. An operand beyond
//          65504 becomes infinity, which is why fp16 training needs loss
//          scaling (worker/loss_scale.h).
//
// Everything outside a GEMM (activations between layers, element-wise ops,
// batch norm statistics, the softmax and the loss, gradients and the
// optimizer) stays fp32: the places where half precision loses accuracy.

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ps {

enum class Precision { kFp32, kBf16, kFp16 };

// "fp32", "bf16", "fp16".
absl::string_view PrecisionName(Precision precision);

// Inverse of PrecisionName; kInvalidArgument names the unknown string and
// lists the known ones.
absl::StatusOr<Precision> ParsePrecision(absl::string_view name);

}  // namespace ps

#endif  // PS_COMMON_PRECISION_H_
