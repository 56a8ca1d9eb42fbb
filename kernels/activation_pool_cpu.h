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

// One (n, c) plane of the above, for kernels that fuse these passes into
// their own (the convolution's write-back): x and a (which may alias x) hold
// shape.height x shape.width floats, y and argmax (max only; else unused)
// out_height x out_width, dy and dx likewise; `rows` is shape.width floats
// of scratch. The forward activates x + *bias when bias is not null (the
// same float sums as adding the bias first). shape.batch and shape.channels
// are not read.
void ActivationPoolPlaneForward(PoolActivation act, bool max, const Pool2dShape& shape,
                                const float* x, const float* bias, float* a, float* y,
                                int32_t* argmax, float* rows);
void ActivationPoolPlaneBackward(PoolActivation act, bool max, const Pool2dShape& shape,
                                 const float* a, const float* dy, const int32_t* argmax,
                                 float* dx, float* rows);

}  // namespace ps::kernels::internal

#endif  // PS_KERNELS_ACTIVATION_POOL_CPU_H_
