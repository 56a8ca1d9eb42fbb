#ifndef PS_KERNELS_BATCH_NORM_CPU_H_
#define PS_KERNELS_BATCH_NORM_CPU_H_

// The CPU reference implementations behind batch_norm.h; same contracts. The
// shape and hyperparameters are already validated. Work is split over
// channels; each channel's statistics are accumulated in double, in a fixed
// order, so results do not depend on the thread count.

#include <cstdint>

#include "common/cpu_device.h"
#include "kernels/batch_norm.h"

namespace ps::kernels::internal {

void BatchNormForwardTrainingCpu(CpuDevice& device, const BatchNormShape& shape, float eps,
                                 float momentum, const float* x, const float* gamma,
                                 const float* beta, float* y, float* save_mean, float* save_inv_std,
                                 float* running_mean, float* running_var);

void BatchNormForwardInferenceCpu(CpuDevice& device, const BatchNormShape& shape, float eps,
                                  const float* x, const float* gamma, const float* beta,
                                  const float* running_mean, const float* running_var, float* y);

void BatchNormBackwardCpu(CpuDevice& device, const BatchNormShape& shape, const float* x,
                          const float* gamma, const float* save_mean, const float* save_inv_std,
                          const float* dy, float* dx, float* dgamma, float* dbeta);

}  // namespace ps::kernels::internal

#endif  // PS_KERNELS_BATCH_NORM_CPU_H_
