#ifndef PS_KERNELS_POOL_CPU_H_
#define PS_KERNELS_POOL_CPU_H_

// The CPU reference implementations behind pool.h; same contracts. The shape
// is already validated.

#include <cstdint>

#include "common/cpu_device.h"
#include "kernels/pool.h"

namespace ps::kernels::internal {

void MaxPool2dForwardCpu(CpuDevice& device, const Pool2dShape& shape, const float* x, float* y,
                         int32_t* argmax);
void MaxPool2dBackwardCpu(CpuDevice& device, const Pool2dShape& shape, const float* dy,
                          const int32_t* argmax, float* dx);
void AvgPool2dForwardCpu(CpuDevice& device, const Pool2dShape& shape, const float* x, float* y);
void AvgPool2dBackwardCpu(CpuDevice& device, const Pool2dShape& shape, const float* dy, float* dx);

}  // namespace ps::kernels::internal

#endif  // PS_KERNELS_POOL_CPU_H_
