#ifndef PS_KERNELS_SOFTMAX_CROSS_ENTROPY_CUDA_H_
#define PS_KERNELS_SOFTMAX_CROSS_ENTROPY_CUDA_H_

// CUDA launchers behind softmax_cross_entropy.h. Each queues its kernels on
// `stream` and returns the launch error (cudaSuccess when queued). Pointers
// are device memory of the GPU current on the calling thread. Sizes are
// already validated (classes in [1, 2^31)).

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ps::kernels::internal {

// Bytes of device scratch SoftmaxCrossEntropyCuda needs for `batch` rows: its
// per-block partial sums, which a second single-block pass adds up in a fixed
// order (no float atomics, so loss_sum is reproducible bit for bit).
int64_t SoftmaxCrossEntropyCudaScratchBytes(int64_t batch);

// `scratch` holds at least SoftmaxCrossEntropyCudaScratchBytes(batch) bytes
// and must not be reused until this work has run; dlogits may be null.
cudaError_t SoftmaxCrossEntropyCuda(cudaStream_t stream, int64_t batch, int64_t classes,
                                    const float* logits, const int32_t* labels, float grad_scale,
                                    void* scratch, float* loss_sum, float* correct, float* dlogits);

cudaError_t ArgmaxRowsCuda(cudaStream_t stream, int64_t batch, int64_t classes, const float* logits,
                           int32_t* predictions);

}  // namespace ps::kernels::internal

#endif  // PS_KERNELS_SOFTMAX_CROSS_ENTROPY_CUDA_H_
