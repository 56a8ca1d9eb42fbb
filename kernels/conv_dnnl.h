#ifndef PS_KERNELS_CONV_DNNL_H_
#define PS_KERNELS_CONV_DNNL_H_

// oneDNN's convolution (Debian's libdnnl 2.6, the library PyTorch 1.13 runs
// on this machine) behind conv.h's CPU path, for the layer shapes and passes
// where it is faster than conv_cpu.h's im2col + GEMM (ResNet's backward
// passes and most of its 3x3 forwards, see conv_dnnl.cc); same contracts as
// conv.h. The shape has been validated
// and every pointer is host memory.
//
// Method: our tensors stay NCHW (weights OIHW). With DnnlMethod::kBlocked
// the primitive picks its own layouts (nChw16c activations, blocked weights)
// and each call reorders its inputs into them and its outputs back, in
// device scratch; kPlain runs the primitive on NCHW itself (oneDNN then
// takes its im2col + GEMM implementation); kWinograd is kBlocked with
// oneDNN's Winograd F(4x4, 3x3) algorithm (3x3 stride-1 kernels, channels
// in multiples of 16: see WinogradApplies), which does 4x fewer
// multiplications per output tile than a direct convolution at a larger
// rounding error (measured: 2-4e-6 of the largest output against 2-4e-7,
// float32). Which one wins per shape is measured by
// kernels/conv_benchmark.cc; PreferDnnlConvForward/Backward say what the
// measurements chose.
//
// Threads: a device of T threads cuts the layer into T parts and runs one
// on each of its threads (forward and dx: slices of the batch; dweight and
// dbias: slices of the output channels, in whole 16-channel blocks, reading
// their channels of dy in place), each part a primitive on one OpenMP
// thread, the calling one. Debian builds oneDNN on GCC's OpenMP, whose idle
// team threads spin: an OpenMP team of T beside the device's own pool
// threads would oversubscribe the cores, and on a loaded
// machine a team's barriers wait for descheduled threads (measured: 2-thread
// teams 5-50x slower than one thread while other builds ran). Cutting by
// output channels also leaves no partial weight gradients to add up, so the
// result does not depend on the thread count.
//
// Primitives: creating one costs up to milliseconds, so each (part shape,
// pass, bias or not, layout) is created once, on the calling thread, and
// kept for the life of the process in a memo guarded by a mutex (immutable
// primitives, as oneDNN's own primitive cache; it changes no result).
// Executing a primitive from several threads at once is safe: each call
// passes its own memory and scratchpad (its share of device scratch slot 0).
//
// Errors: oneDNN's exceptions become kInternal statuses naming the call.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/cpu_device.h"
#include "kernels/conv.h"

namespace ps::kernels::internal {

enum class DnnlMethod {
  kPlain,     // direct, on NCHW / OIHW as stored
  kBlocked,   // direct, in oneDNN's choice of layouts, with reorders in and out
  kWinograd,  // Winograd F(4x4, 3x3), blocked as kBlocked
};

enum class DnnlPass { kForward, kBackwardData, kBackwardWeights };

// Whether oneDNN's Winograd convolution takes this shape: a 3x3 kernel at
// stride 1 with padding at most 1, and input and output channels in whole
// 16-channel blocks (the primitive's own conditions on AVX-512; a part of
// the weight gradient keeps whole blocks, see conv_dnnl.cc).
bool WinogradApplies(const Conv2dShape& shape);

// Whether conv.h's entry points send this shape's forward pass, or its
// backward pass (with dx or without), to oneDNN and by which method: the
// measured choice (see conv_dnnl.cc), made only on CPUs with AVX-512
// (DnnlConvMeasuredHere; false for every shape elsewhere).
bool DnnlConvMeasuredHere();
bool PreferDnnlConvForward(const Conv2dShape& shape, DnnlMethod* method);
bool PreferDnnlConvBackward(const Conv2dShape& shape, bool need_dx, DnnlMethod* method);

// bias may be null.
absl::Status Conv2dForwardDnnl(CpuDevice& device, const Conv2dShape& shape, DnnlMethod method,
                               const float* x, const float* weight, const float* bias, float* y);

// dx and dbias may be null (skipped).
absl::Status Conv2dBackwardDnnl(CpuDevice& device, const Conv2dShape& shape, DnnlMethod method,
                                const float* x, const float* weight, const float* dy, float* dx,
                                float* dweight, float* dbias);

// The name oneDNN gives the implementation that computes `pass` of a
// one-thread part of this shape by `method` (e.g. "jit_wino_4x3:avx512_core";
// the direct primitive's where Winograd has none): what the benchmarks and
// tests check the choice against.
absl::StatusOr<std::string> DnnlConvImplementation(const Conv2dShape& shape, DnnlPass pass,
                                                   DnnlMethod method);

}  // namespace ps::kernels::internal

#endif  // PS_KERNELS_CONV_DNNL_H_
