#include "kernels/sgd_hyper.h"

#include "absl/strings/str_cat.h"

namespace ps::kernels {

// Written as !(x >= 0) so NaN is rejected too.
absl::Status ValidateSgd(int64_t n, const SgdHyper& hyper, const float* momentum_buf) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("SgdUpdate: n = ", n, " < 0"));
  if (!(hyper.lr >= 0.f)) {
    return absl::InvalidArgumentError(absl::StrCat("SgdUpdate: invalid lr ", hyper.lr));
  }
  if (!(hyper.momentum >= 0.f)) {
    return absl::InvalidArgumentError(absl::StrCat("SgdUpdate: invalid momentum ", hyper.momentum));
  }
  if (!(hyper.weight_decay >= 0.f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("SgdUpdate: invalid weight_decay ", hyper.weight_decay));
  }
  if (hyper.nesterov && hyper.momentum == 0.f) {
    return absl::InvalidArgumentError("SgdUpdate: nesterov requires momentum > 0");
  }
  if (hyper.momentum != 0.f && momentum_buf == nullptr && n > 0) {
    return absl::InvalidArgumentError("SgdUpdate: momentum_buf is null but momentum != 0");
  }
  return absl::OkStatus();
}

}  // namespace ps::kernels
