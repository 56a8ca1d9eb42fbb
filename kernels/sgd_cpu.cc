#include "kernels/sgd_cpu.h"

namespace ps::kernels {
namespace {
// Below this many elements a loop stays on one thread: waking the pool costs
// more than the work.
constexpr int64_t kMinChunk = 1 << 15;
}  // namespace

absl::Status SgdUpdateCpu(CpuDevice& device, int64_t n, const SgdHyper& hyper, float grad_scale,
                          const float* grad, float* param, float* momentum_buf) {
  return SgdUpdateCpu(device, n, hyper, grad_scale, grad, param, param, momentum_buf);
}

absl::Status SgdUpdateCpu(CpuDevice& device, int64_t n, const SgdHyper& hyper, float grad_scale,
                          const float* grad, const float* param, float* param_out,
                          float* momentum_buf) {
  if (absl::Status s = ValidateSgd(n, hyper, momentum_buf); !s.ok()) return s;
  const float lr = hyper.lr;
  const float momentum = hyper.momentum;
  const float weight_decay = hyper.weight_decay;
  const bool nesterov = hyper.nesterov;
  if (momentum == 0.f) {
    device.ParallelFor(n, kMinChunk, [=](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const float g = grad_scale * grad[i] + weight_decay * param[i];
        param_out[i] = param[i] - lr * g;
      }
    });
    return absl::OkStatus();
  }
  device.ParallelFor(n, kMinChunk, [=](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float g = grad_scale * grad[i] + weight_decay * param[i];
      const float buf = momentum * momentum_buf[i] + g;
      momentum_buf[i] = buf;
      const float d = nesterov ? g + momentum * buf : buf;
      param_out[i] = param[i] - lr * d;
    }
  });
  return absl::OkStatus();
}

}  // namespace ps::kernels
