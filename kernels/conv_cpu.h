#ifndef PS_KERNELS_CONV_CPU_H_
#define PS_KERNELS_CONV_CPU_H_

// The CPU implementation behind conv.h; same contracts. The shape has been
// validated and every pointer is host memory.
//
// Method: im2col + GEMM over blocks of samples. A block's columns
// ([C*KH*KW] x [samples * OH * OW], about 192 KiB) stay in the L1/L2 cache
// while they are written, multiplied and read back; the GEMM's result is then
// written to NCHW together with the bias. The backward pass gathers dy into
// the same block layout (summing dbias on the way), accumulates dweight with
// one GEMM per block and folds weight^T * dy back onto dx (col2im).
//
// Threads: on a CpuDevice with several threads each thread runs whole blocks
// with its own scratch and partial gradients, summed at the end; its GEMMs
// stay on that thread (gemm.h: a GEMM inside a ParallelFor part is
// single-threaded), so the GEMM's threads and the device's never compete.
//
// Scratch: slot 0 holds each thread's columns and a zero-bordered input
// plane, slot 1 its GEMM output or dy block and partial gradients.

#include <cstdint>

#include "absl/status/status.h"
#include "common/cpu_device.h"
#include "kernels/activation_pool.h"
#include "kernels/conv.h"
#include "kernels/pool.h"

namespace ps::kernels::internal {

// An activation and pooling fused onto the convolution's output (see
// conv_activation_pool.h). Forward: each output plane, bias added, is
// activated into `a` and pooled into `y` (and `argmax`) while the block is in
// cache, and nothing is written to the convolution's y. Backward: each
// block's dy is computed from `a` and the pooled gradient `pooled_dy` (and
// `argmax`) into a cache-resident buffer, and the convolution's dy is not
// read. `pool` is validated against the convolution's output shape.
struct ActivationPoolEpilogue {
  PoolActivation activation = PoolActivation::kSigmoid;
  bool max = false;
  Pool2dShape pool;
  float* a = nullptr;             // forward output, [N, O, OH, OW]
  float* y = nullptr;             // forward output, pooled
  int32_t* argmax = nullptr;      // forward output (max only)
  const float* a_in = nullptr;    // backward input: the forward's a
  const float* pooled_dy = nullptr;
  const int32_t* argmax_in = nullptr;
};

// With `epilogue`, y (forward) or dy (backward) is ignored; see above.
absl::Status Conv2dForwardCpu(CpuDevice& device, const Conv2dShape& shape, const float* x,
                              const float* weight, const float* bias, float* y,
                              const ActivationPoolEpilogue* epilogue = nullptr);

absl::Status Conv2dBackwardCpu(CpuDevice& device, const Conv2dShape& shape, const float* x,
                               const float* weight, const float* dy, float* dx, float* dweight,
                               float* dbias, const ActivationPoolEpilogue* epilogue = nullptr);

}  // namespace ps::kernels::internal

#endif  // PS_KERNELS_CONV_CPU_H_
