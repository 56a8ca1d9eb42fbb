#ifndef PS_KERNELS_ACTIVATION_POOL_CPU_H_
#define PS_KERNELS_ACTIVATION_POOL_CPU_H_

// The CPU reference implementations behind activation_pool.h; same
// contracts. The shape is already validated.

#include <cstdint>

#include "common/cpu_device.h"
#include "kernels/activation_pool.h"

namespace ps::kernels::internal {

void ActivationAvgPool2dForwardCpu(CpuDevice& device, PoolActivation act, const Pool2dShape& shape,
                                   const float* x, float* a, float* y);
void ActivationAvgPool2dBackwardCpu(CpuDevice& device, PoolActivation act,
                                    const Pool2dShape& shape, const float* a, const float* dy,
                                    float* dx);
void ActivationMaxPool2dForwardCpu(CpuDevice& device, PoolActivation act, const Pool2dShape& shape,
                                   const float* x, float* a, float* y, int32_t* argmax);
void ActivationMaxPool2dBackwardCpu(CpuDevice& device, PoolActivation act,
                                    const Pool2dShape& shape, const float* a, const float* dy,
                                    const int32_t* argmax, float* dx);

}  // namespace ps::kernels::internal

#endif  // PS_KERNELS_ACTIVATION_POOL_CPU_H_
