#include "kernels/sgd_cpu.h"

#include <cstring>

namespace ps::kernels {
namespace {
// Below this many elements a loop stays on one thread: waking the pool costs
// more than the work.
constexpr int64_t kMinChunk = 1 << 15;

// Elements [b, e) of the update, with the gradient's element i read by
// grad_at(i): the one place the update's arithmetic is written, so that
// every entry point gives the same bits.
template <typename GradAt>
void UpdateRange(int64_t b, int64_t e, const SgdHyper& hyper, float grad_scale, GradAt grad_at,
                 const float* param, float* param_out, float* momentum_buf) {
  const float lr = hyper.lr;
  const float momentum = hyper.momentum;
  const float weight_decay = hyper.weight_decay;
  const bool nesterov = hyper.nesterov;
  if (momentum_buf == nullptr) {
    for (int64_t i = b; i < e; ++i) {
      const float g = grad_scale * grad_at(i) + weight_decay * param[i];
      param_out[i] = param[i] - lr * g;
    }
    return;
  }
  for (int64_t i = b; i < e; ++i) {
    const float g = grad_scale * grad_at(i) + weight_decay * param[i];
    const float buf = momentum * momentum_buf[i] + g;
    momentum_buf[i] = buf;
    const float d = nesterov ? g + momentum * buf : buf;
    param_out[i] = param[i] - lr * d;
  }
}

inline float LoadF32(const char* bytes) {
  float value;
  std::memcpy(&value, bytes, sizeof(value));
  return value;
}
}  // namespace

absl::Status SgdUpdateCpu(CpuDevice& device, int64_t n, const SgdHyper& hyper, float grad_scale,
                          const float* grad, float* param, float* momentum_buf) {
  return SgdUpdateCpu(device, n, hyper, grad_scale, grad, param, param, momentum_buf);
}

absl::Status SgdUpdateCpu(CpuDevice& device, int64_t n, const SgdHyper& hyper, float grad_scale,
                          const float* grad, const float* param, float* param_out,
                          float* momentum_buf) {
  if (absl::Status s = ValidateSgd(n, hyper, momentum_buf); !s.ok()) return s;
  // Without momentum the buffer is not touched (ValidateSgd: none given).
  float* const buf = hyper.momentum == 0.f ? nullptr : momentum_buf;
  device.ParallelFor(n, kMinChunk, [=](int64_t b, int64_t e) {
    UpdateRange(b, e, hyper, grad_scale, [grad](int64_t i) { return grad[i]; }, param,
                param_out, buf);
  });
  return absl::OkStatus();
}

absl::Status SgdUpdateAddingCpu(int64_t n, const SgdHyper& hyper, float grad_scale,
                                const float* grad, const void* addend, const float* param,
                                float* param_out, float* momentum_buf) {
  if (absl::Status s = ValidateSgd(n, hyper, momentum_buf); !s.ok()) return s;
  float* const buf = hyper.momentum == 0.f ? nullptr : momentum_buf;
  const char* const bytes = static_cast<const char*>(addend);
  if (grad == nullptr) {
    // 0 + a: the first term of a sum (-0 becomes +0), as the sum's own
    // first term is written.
    UpdateRange(0, n, hyper, grad_scale,
                [bytes](int64_t i) { return LoadF32(bytes + 4 * i) + 0.f; }, param, param_out,
                buf);
  } else {
    UpdateRange(0, n, hyper, grad_scale,
                [grad, bytes](int64_t i) { return grad[i] + LoadF32(bytes + 4 * i); }, param,
                param_out, buf);
  }
  return absl::OkStatus();
}

}  // namespace ps::kernels
