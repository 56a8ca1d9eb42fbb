#ifndef PS_KERNELS_ACTIVATION_CPU_H_
#define PS_KERNELS_ACTIVATION_CPU_H_

// The CPU reference implementations behind activation.h; same contracts.

#include <cstdint>

#include "common/cpu_device.h"

namespace ps::kernels::internal {

void ReluForwardCpu(CpuDevice& device, int64_t n, const float* x, float* y);
void ReluBackwardCpu(CpuDevice& device, int64_t n, const float* y, const float* dy, float* dx);
void SigmoidForwardCpu(CpuDevice& device, int64_t n, const float* x, float* y);
void SigmoidBackwardCpu(CpuDevice& device, int64_t n, const float* y, const float* dy, float* dx);

}  // namespace ps::kernels::internal

#endif  // PS_KERNELS_ACTIVATION_CPU_H_
