#include "kernels/activation_pool.h"

#include "common/status_macros.h"
#include "kernels/activation_pool_cpu.h"
#include "kernels/dispatch.h"

#ifdef PS_WITH_CUDA
#include "kernels/activation_pool_cuda.h"
#include "kernels/pool_dims.h"
#endif

namespace ps::kernels {

absl::Status ActivationAvgPool2dForward(Device& device, PoolActivation act,
                                        const Pool2dShape& shape, const float* x, float* a,
                                        float* y) {
  PS_RETURN_IF_ERROR(ValidatePool2dShape(shape));
  if (device.is_cpu()) {
    internal::ActivationAvgPool2dForwardCpu(AsCpu(device), act, shape, x, a, y);
    return absl::OkStatus();
  }
  PS_LAUNCH_CUDA(device, "ActivationAvgPool2dForward",
                 internal::ActivationAvgPool2dForwardCuda(stream, act == PoolActivation::kSigmoid,
                                                          internal::ToPoolDims(shape), x, a, y));
}

absl::Status ActivationAvgPool2dBackward(Device& device, PoolActivation act,
                                         const Pool2dShape& shape, const float* a,
                                         const float* dy, float* dx) {
  PS_RETURN_IF_ERROR(ValidatePool2dShape(shape));
  if (device.is_cpu()) {
    internal::ActivationAvgPool2dBackwardCpu(AsCpu(device), act, shape, a, dy, dx);
    return absl::OkStatus();
  }
  PS_LAUNCH_CUDA(device, "ActivationAvgPool2dBackward",
                 internal::ActivationAvgPool2dBackwardCuda(stream, act == PoolActivation::kSigmoid,
                                                           internal::ToPoolDims(shape), a, dy, dx));
}

absl::Status ActivationMaxPool2dForward(Device& device, PoolActivation act,
                                        const Pool2dShape& shape, const float* x, float* a,
                                        float* y, int32_t* argmax) {
  PS_RETURN_IF_ERROR(ValidatePool2dShape(shape));
  if (device.is_cpu()) {
    internal::ActivationMaxPool2dForwardCpu(AsCpu(device), act, shape, x, a, y, argmax);
    return absl::OkStatus();
  }
  PS_LAUNCH_CUDA(device, "ActivationMaxPool2dForward",
                 internal::ActivationMaxPool2dForwardCuda(stream, act == PoolActivation::kSigmoid,
                                                          internal::ToPoolDims(shape), x, a, y, argmax));
}

absl::Status ActivationMaxPool2dBackward(Device& device, PoolActivation act,
                                         const Pool2dShape& shape, const float* a,
                                         const float* dy, const int32_t* argmax, float* dx) {
  PS_RETURN_IF_ERROR(ValidatePool2dShape(shape));
  if (device.is_cpu()) {
    internal::ActivationMaxPool2dBackwardCpu(AsCpu(device), act, shape, a, dy, argmax, dx);
    return absl::OkStatus();
  }
  PS_LAUNCH_CUDA(device, "ActivationMaxPool2dBackward",
                 internal::ActivationMaxPool2dBackwardCuda(stream, act == PoolActivation::kSigmoid,
                                                           internal::ToPoolDims(shape), a, dy, argmax, dx));
}

}  // namespace ps::kernels
