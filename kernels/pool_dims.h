#ifndef PS_KERNELS_POOL_DIMS_H_
#define PS_KERNELS_POOL_DIMS_H_

// Pool2dShape -> the PoolDims the CUDA launchers take (pool_cuda.h restates
// the shape without pool.h so that nvcc sees only that header). Internal to
// kernels/; only for code built with PS_WITH_CUDA.

#include "kernels/pool.h"
#include "kernels/pool_cuda.h"

namespace ps::kernels::internal {

inline PoolDims ToPoolDims(const Pool2dShape& s) {
  return {s.batch,    s.channels, s.height, s.width, s.kernel_h,     s.kernel_w,
          s.stride_h, s.stride_w, s.pad_h,  s.pad_w, s.out_height(), s.out_width()};
}

}  // namespace ps::kernels::internal

#endif  // PS_KERNELS_POOL_DIMS_H_
