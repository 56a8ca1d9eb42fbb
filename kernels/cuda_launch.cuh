#ifndef PS_KERNELS_CUDA_LAUNCH_CUH_
#define PS_KERNELS_CUDA_LAUNCH_CUH_

// Launch geometry shared by the CUDA kernels.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace ps::kernels::internal {

constexpr int kThreadsPerBlock = 256;

// Blocks for a grid-stride loop over n elements: enough to fill an H100/H200
// (132 SMs x 16 blocks) without launching more than the data needs.
inline unsigned int GridFor(int64_t n) {
  const int64_t blocks = (n + kThreadsPerBlock - 1) / kThreadsPerBlock;
  return static_cast<unsigned int>(std::max<int64_t>(1, std::min<int64_t>(blocks, 132 * 16)));
}

// for (int64_t i : GridStride(n)) style loop index helpers.
#define PS_GRID_STRIDE_LOOP(i, n)                                               \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; \
       i < (n); i += static_cast<int64_t>(blockDim.x) * gridDim.x)

}  // namespace ps::kernels::internal

#endif  // PS_KERNELS_CUDA_LAUNCH_CUH_
