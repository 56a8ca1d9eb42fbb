#ifndef PS_KERNELS_SGD_CPU_H_
#define PS_KERNELS_SGD_CPU_H_

// The SGD update on a CPU device: the reference behind sgd.h, and the update
// the parameter server applies, which links no CUDA code. Same contract as
// SgdUpdate (sgd.h): validates its arguments (kInvalidArgument, nothing
// changed) and updates n parameters in host memory in place, split over the
// device's threads.

#include <cstdint>

#include "common/cpu_device.h"
#include "absl/status/status.h"
#include "kernels/sgd_hyper.h"

namespace ps::kernels {

absl::Status SgdUpdateCpu(CpuDevice& device, int64_t n, const SgdHyper& hyper, float grad_scale,
                          const float* grad, float* param, float* momentum_buf);

// The same update out of place: reads the parameters from `param_in` and
// writes the updated ones to `param_out` (which may be `param_in`: then it is
// the call above), bit for bit what the in-place update writes. The server
// keeps each chunk's previous parameters this way without copying them
// first: the memory traffic of an in-place update.
absl::Status SgdUpdateCpu(CpuDevice& device, int64_t n, const SgdHyper& hyper, float grad_scale,
                          const float* grad, const float* param_in, float* param_out,
                          float* momentum_buf);

// The out-of-place update with the gradient grad[i] + a[i], where `addend`
// points at n little-endian floats a[0..n) at any alignment (the bytes of a
// received message, read in place); grad == nullptr stands for a sum not
// started: the gradient is then 0 + a[i] (-0 becomes +0). Bit for bit what
// adding a into grad (or writing 0 + a) and then SgdUpdateCpu gives, without
// writing the sum and reading it back. Runs on the calling thread: the
// caller splits the work (the server over a message's pieces).
absl::Status SgdUpdateAddingCpu(int64_t n, const SgdHyper& hyper, float grad_scale,
                                const float* grad, const void* addend, const float* param_in,
                                float* param_out, float* momentum_buf);

}  // namespace ps::kernels

#endif  // PS_KERNELS_SGD_CPU_H_
