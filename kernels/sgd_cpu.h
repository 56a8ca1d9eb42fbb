#ifndef PS_KERNELS_SGD_CPU_H_
#define PS_KERNELS_SGD_CPU_H_

// The CPU reference implementation behind sgd.h; same contract. Arguments are
// already validated (momentum_buf non-null when hyper.momentum != 0).

#include <cstdint>

#include "common/cpu_device.h"
#include "kernels/sgd.h"

namespace ps::kernels::internal {

void SgdUpdateCpu(CpuDevice& device, int64_t n, const SgdHyper& hyper, float grad_scale,
                  const float* grad, float* param, float* momentum_buf);

}  // namespace ps::kernels::internal

#endif  // PS_KERNELS_SGD_CPU_H_
