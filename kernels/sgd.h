#ifndef PS_KERNELS_SGD_H_
#define PS_KERNELS_SGD_H_

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
#include "common/device.h"

namespace ps::kernels {

struct SgdHyper {
  float lr = 0.1f;
  float momentum = 0.f;
  float weight_decay = 0.f;
  bool nesterov = false;
};

// Updates n parameters in place. momentum_buf may be null only when
// hyper.momentum == 0. All pointers in `device` memory. kInvalidArgument, as
// torch.optim.SGD, for negative lr / momentum / weight_decay or nesterov
// without momentum, and for n < 0 or a missing momentum_buf.
absl::Status SgdUpdate(Device& device, int64_t n, const SgdHyper& hyper, float grad_scale,
                       const float* grad, float* param, float* momentum_buf);

}  // namespace ps::kernels

#endif  // PS_KERNELS_SGD_H_
