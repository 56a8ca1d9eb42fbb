#ifndef PS_KERNELS_ELEMENTWISE_CPU_H_
#define PS_KERNELS_ELEMENTWISE_CPU_H_

// The CPU reference implementations behind elementwise.h; same contracts.

#include <cstdint>

#include "common/cpu_device.h"

namespace ps::kernels::internal {

void FillCpu(CpuDevice& device, int64_t n, float value, float* y);
void ScaleCpu(CpuDevice& device, int64_t n, float alpha, float* y);
void AxpyCpu(CpuDevice& device, int64_t n, float alpha, const float* x, float* y);
void AddCpu(CpuDevice& device, int64_t n, const float* a, const float* b, float* out);

}  // namespace ps::kernels::internal

#endif  // PS_KERNELS_ELEMENTWISE_CPU_H_
