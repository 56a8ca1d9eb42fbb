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
// with its own scratch and partial gradients, summed at the end. Its GEMMs
// must then stay on that thread (concurrent multi-threaded OpenBLAS calls
// spin against each other): they do with SetBlasThreads(1), and with more
// BLAS threads when the blocks can be cut small enough for OpenBLAS not to
// thread them (true of LeNet's layers). Otherwise the blocks run in order on
// the calling thread and BLAS threads their (then large) GEMMs.
//
// Scratch: slot 0 holds each thread's columns and a zero-bordered input
// plane, slot 1 its GEMM output or dy block and partial gradients.

#include "absl/status/status.h"
#include "common/cpu_device.h"
#include "kernels/conv.h"

namespace ps::kernels::internal {

absl::Status Conv2dForwardCpu(CpuDevice& device, const Conv2dShape& shape, const float* x,
                              const float* weight, const float* bias, float* y);

absl::Status Conv2dBackwardCpu(CpuDevice& device, const Conv2dShape& shape, const float* x,
                               const float* weight, const float* dy, float* dx, float* dweight,
                               float* dbias);

}  // namespace ps::kernels::internal

#endif  // PS_KERNELS_CONV_CPU_H_
