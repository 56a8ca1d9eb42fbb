#ifndef PS_KERNELS_LINEAR_CPU_H_
#define PS_KERNELS_LINEAR_CPU_H_

// The CPU implementation behind linear.h; same contracts. Sizes have been
// checked (non-negative, below 2^31) and every pointer is host memory.
//
// Threads: with multi-threaded GEMMs (SetBlasThreads > 1) each GEMM is one
// call that oneDNN spreads over its OpenMP threads: a large layer's weights
// are then read once, not once per slice. With single-threaded GEMMs the
// device's threads each run a GEMM on a slice of the rows. The bias passes
// use the device's threads.

#include <cstdint>

#include "common/cpu_device.h"

namespace ps::kernels::internal {

void LinearForwardCpu(CpuDevice& device, int64_t batch, int64_t in_features, int64_t out_features,
                      const float* x, const float* weight, const float* bias, float* y);

void LinearBackwardCpu(CpuDevice& device, int64_t batch, int64_t in_features, int64_t out_features,
                       const float* x, const float* weight, const float* dy, float* dx,
                       float* dweight, float* dbias);

// The row-block forms (kernels/linear.h); sizes and pointers checked.
void LinearForwardRowsCpu(CpuDevice& device, int64_t batch, int64_t in_features,
                          int64_t out_features, const float* x, const float* weight,
                          int64_t row_begin, int64_t row_end, float* y);
void LinearAddBiasCpu(CpuDevice& device, int64_t batch, int64_t out_features, const float* bias,
                      float* y);
void LinearWeightGradientRowsCpu(CpuDevice& device, int64_t batch, int64_t in_features,
                                 int64_t out_features, const float* x, const float* dy,
                                 int64_t row_begin, int64_t row_end, float* dweight);

}  // namespace ps::kernels::internal

#endif  // PS_KERNELS_LINEAR_CPU_H_
