#include "kernels/cuda_launch.cuh"
#include "kernels/sgd_cuda.h"

namespace ps::kernels::internal {
namespace {

// Plain SGD (momentum == 0): no buffer is read or written.
__global__ void SgdKernel(int64_t n, float lr, float weight_decay, float grad_scale,
                          const float* grad, float* param) {
  PS_GRID_STRIDE_LOOP(i, n) {
    const float g = grad_scale * grad[i] + weight_decay * param[i];
    param[i] -= lr * g;
  }
}

__global__ void SgdMomentumKernel(int64_t n, float lr, float momentum, float weight_decay,
                                  bool nesterov, float grad_scale, const float* grad, float* param,
                                  float* momentum_buf) {
  PS_GRID_STRIDE_LOOP(i, n) {
    const float g = grad_scale * grad[i] + weight_decay * param[i];
    const float buf = momentum * momentum_buf[i] + g;
    momentum_buf[i] = buf;
    const float d = nesterov ? g + momentum * buf : buf;
    param[i] -= lr * d;
  }
}

}  // namespace

cudaError_t SgdUpdateCuda(cudaStream_t stream, int64_t n, float lr, float momentum,
                          float weight_decay, bool nesterov, float grad_scale, const float* grad,
                          float* param, float* momentum_buf) {
  if (n == 0) return cudaSuccess;
  if (momentum == 0.f) {
    SgdKernel<<<GridFor(n), kThreadsPerBlock, 0, stream>>>(n, lr, weight_decay, grad_scale, grad,
                                                           param);
  } else {
    SgdMomentumKernel<<<GridFor(n), kThreadsPerBlock, 0, stream>>>(
        n, lr, momentum, weight_decay, nesterov, grad_scale, grad, param, momentum_buf);
  }
  return cudaGetLastError();
}

}  // namespace ps::kernels::internal
