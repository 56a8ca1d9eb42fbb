#include "kernels/batch_norm.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/batch_norm_cpu.h"
#include "kernels/dispatch.h"

#ifdef PS_WITH_CUDA
#include "kernels/batch_norm_cuda.h"
#endif

namespace ps::kernels {
namespace {

absl::Status Invalid(absl::string_view what, absl::string_view field, const absl::AlphaNum& value,
                     absl::string_view requirement) {
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": ", field, " = ", value, ": ", requirement));
}

// The CUDA launchers put one block per channel on grid.x, hence the int32
// bound on channels.
absl::Status ValidateShape(absl::string_view what, const BatchNormShape& s) {
  if (s.batch < 1) return Invalid(what, "batch", s.batch, "must be >= 1");
  if (s.channels < 1 || s.channels > std::numeric_limits<int32_t>::max()) {
    return Invalid(what, "channels", s.channels, "out of range [1, 2^31)");
  }
  if (s.spatial < 1) return Invalid(what, "spatial", s.spatial, "must be >= 1");
  const int64_t max = std::numeric_limits<int64_t>::max();
  if (s.batch > max / s.channels / s.spatial) {
    return Invalid(what, "batch", s.batch, "batch * channels * spatial overflows");
  }
  return absl::OkStatus();
}

absl::Status ValidateEps(absl::string_view what, float eps) {
  if (!(eps >= 0.f) || std::isinf(eps)) {
    return Invalid(what, "eps", eps, "must be finite and >= 0");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status BatchNormForwardTraining(Device& device, const BatchNormShape& shape, float eps,
                                      float momentum, const float* x, const float* gamma,
                                      const float* beta, float* y, float* save_mean,
                                      float* save_inv_std, float* running_mean,
                                      float* running_var) {
  constexpr absl::string_view kWhat = "BatchNormForwardTraining";
  PS_RETURN_IF_ERROR(ValidateShape(kWhat, shape));
  PS_RETURN_IF_ERROR(ValidateEps(kWhat, eps));
  // PyTorch refuses this too: the unbiased running variance divides by M - 1.
  if (shape.batch * shape.spatial < 2) {
    return Invalid(kWhat, "batch * spatial", shape.batch * shape.spatial,
                   "training needs more than one value per channel");
  }
  if (!(momentum >= 0.f && momentum <= 1.f)) {
    return Invalid(kWhat, "momentum", momentum, "must be in [0, 1]");
  }
  if (device.is_cpu()) {
    internal::BatchNormForwardTrainingCpu(AsCpu(device), shape, eps, momentum, x, gamma, beta, y,
                                          save_mean, save_inv_std, running_mean, running_var);
    return absl::OkStatus();
  }
  PS_LAUNCH_CUDA(device, "BatchNormForwardTraining",
                 internal::BatchNormForwardTrainingCuda(
                     stream, shape.batch, shape.channels, shape.spatial, eps, momentum, x, gamma,
                     beta, y, save_mean, save_inv_std, running_mean, running_var));
}

absl::Status BatchNormForwardInference(Device& device, const BatchNormShape& shape, float eps,
                                       const float* x, const float* gamma, const float* beta,
                                       const float* running_mean, const float* running_var,
                                       float* y) {
  constexpr absl::string_view kWhat = "BatchNormForwardInference";
  PS_RETURN_IF_ERROR(ValidateShape(kWhat, shape));
  PS_RETURN_IF_ERROR(ValidateEps(kWhat, eps));
  if (device.is_cpu()) {
    internal::BatchNormForwardInferenceCpu(AsCpu(device), shape, eps, x, gamma, beta, running_mean,
                                           running_var, y);
    return absl::OkStatus();
  }
  PS_LAUNCH_CUDA(
      device, "BatchNormForwardInference",
      internal::BatchNormForwardInferenceCuda(stream, shape.batch, shape.channels, shape.spatial,
                                              eps, x, gamma, beta, running_mean, running_var, y));
}

absl::Status BatchNormBackward(Device& device, const BatchNormShape& shape, const float* x,
                               const float* gamma, const float* save_mean,
                               const float* save_inv_std, const float* dy, float* dx, float* dgamma,
                               float* dbeta) {
  PS_RETURN_IF_ERROR(ValidateShape("BatchNormBackward", shape));
  if (device.is_cpu()) {
    internal::BatchNormBackwardCpu(AsCpu(device), shape, x, gamma, save_mean, save_inv_std, dy, dx,
                                   dgamma, dbeta);
    return absl::OkStatus();
  }
  PS_LAUNCH_CUDA(
      device, "BatchNormBackward",
      internal::BatchNormBackwardCuda(stream, shape.batch, shape.channels, shape.spatial, x, gamma,
                                      save_mean, save_inv_std, dy, dx, dgamma, dbeta));
}

}  // namespace ps::kernels
