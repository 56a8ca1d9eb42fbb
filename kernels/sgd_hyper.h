#ifndef PS_KERNELS_SGD_HYPER_H_
#define PS_KERNELS_SGD_HYPER_H_

// The SGD update, PyTorch's torch.optim.SGD semantics (dampening 0):
//   g    = grad_scale * grad + weight_decay * param
//   buf  = momentum * buf + g          (when momentum != 0; buf starts at 0,
//                                       which equals PyTorch's first-step copy)
//   d    = nesterov ? g + momentum * buf : (momentum != 0 ? buf : g)
//   param -= lr * d
// grad_scale is 1 / (global batch size) when grad holds the gradient of a loss
// summed over the batch, which makes the step that of the mean loss.

#include <cstdint>

#include "absl/status/status.h"

namespace ps::kernels {

struct SgdHyper {
  float lr = 0.1f;
  float momentum = 0.f;
  float weight_decay = 0.f;
  bool nesterov = false;
};

// The checks torch.optim.SGD's constructor makes, plus the buffer the
// momentum variant needs: kInvalidArgument for n < 0, negative (or NaN) lr,
// momentum or weight_decay, nesterov without momentum, and a null
// momentum_buf when momentum != 0 and n > 0.
absl::Status ValidateSgd(int64_t n, const SgdHyper& hyper, const float* momentum_buf);

}  // namespace ps::kernels

#endif  // PS_KERNELS_SGD_HYPER_H_
