#include "kernels/sgd.h"

#include "kernels/dispatch.h"
#include "kernels/sgd_cpu.h"

#ifdef PS_WITH_CUDA
#include "kernels/sgd_cuda.h"
#endif

namespace ps::kernels {

absl::Status SgdUpdate(Device& device, int64_t n, const SgdHyper& hyper, float grad_scale,
                       const float* grad, float* param, float* momentum_buf) {
  if (device.is_cpu()) {
    return SgdUpdateCpu(AsCpu(device), n, hyper, grad_scale, grad, param, momentum_buf);
  }
  if (absl::Status s = ValidateSgd(n, hyper, momentum_buf); !s.ok()) return s;
  PS_LAUNCH_CUDA(device, "SgdUpdate",
                 internal::SgdUpdateCuda(stream, n, hyper.lr, hyper.momentum, hyper.weight_decay,
                                         hyper.nesterov, grad_scale, grad, param, momentum_buf));
}

}  // namespace ps::kernels
