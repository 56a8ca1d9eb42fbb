#ifndef PS_KERNELS_SGD_H_
#define PS_KERNELS_SGD_H_

// The SGD update on any device; its semantics are in sgd_hyper.h. The CPU
// implementation (sgd_cpu.h) is also usable alone, without the CUDA build.

#include <cstdint>

#include "absl/status/status.h"
#include "common/device.h"
#include "kernels/sgd_hyper.h"

namespace ps::kernels {

// Updates n parameters in place. momentum_buf may be null only when
// hyper.momentum == 0. All pointers in `device` memory. kInvalidArgument, as
// torch.optim.SGD, for negative lr / momentum / weight_decay or nesterov
// without momentum, and for n < 0 or a missing momentum_buf.
absl::Status SgdUpdate(Device& device, int64_t n, const SgdHyper& hyper, float grad_scale,
                       const float* grad, float* param, float* momentum_buf);

}  // namespace ps::kernels

#endif  // PS_KERNELS_SGD_H_
