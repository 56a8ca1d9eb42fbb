#ifndef PS_KERNELS_SOFTMAX_CROSS_ENTROPY_CPU_H_
#define PS_KERNELS_SOFTMAX_CROSS_ENTROPY_CPU_H_

// The CPU reference implementations behind softmax_cross_entropy.h; same
// contracts. Sizes are already validated.

#include <cstdint>

#include "common/cpu_device.h"

namespace ps::kernels::internal {

void SoftmaxCrossEntropyCpu(CpuDevice& device, int64_t batch, int64_t classes, const float* logits,
                            const int32_t* labels, float grad_scale, float* loss_sum,
                            float* correct, float* dlogits);

void ArgmaxRowsCpu(CpuDevice& device, int64_t batch, int64_t classes, const float* logits,
                   int32_t* predictions);

}  // namespace ps::kernels::internal

#endif  // PS_KERNELS_SOFTMAX_CROSS_ENTROPY_CPU_H_
