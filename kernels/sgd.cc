#include "kernels/sgd.h"

#include "absl/strings/str_cat.h"
#include "kernels/dispatch.h"
#include "kernels/sgd_cpu.h"

#ifdef PS_WITH_CUDA
#include "kernels/sgd_cuda.h"
#endif

namespace ps::kernels {
namespace {

// The checks torch.optim.SGD's constructor makes, plus the buffer the
// momentum variant needs. Written as !(x >= 0) so NaN is rejected too.
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

}  // namespace

absl::Status SgdUpdate(Device& device, int64_t n, const SgdHyper& hyper, float grad_scale,
                       const float* grad, float* param, float* momentum_buf) {
  if (absl::Status s = ValidateSgd(n, hyper, momentum_buf); !s.ok()) return s;
  if (device.is_cpu()) {
    internal::SgdUpdateCpu(AsCpu(device), n, hyper, grad_scale, grad, param, momentum_buf);
    return absl::OkStatus();
  }
  PS_LAUNCH_CUDA(device, "SgdUpdate",
                 internal::SgdUpdateCuda(stream, n, hyper.lr, hyper.momentum, hyper.weight_decay,
                                         hyper.nesterov, grad_scale, grad, param, momentum_buf));
}

}  // namespace ps::kernels
