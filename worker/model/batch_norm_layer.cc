#include "worker/model/batch_norm_layer.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/elementwise.h"

namespace ps::worker::model {

using internal::AddBuffer;
using internal::AddParameter;
using internal::BadInput;
using internal::CheckDevice;
using internal::CheckGradShape;

BatchNorm::BatchNorm(Device* device, int64_t channels, int spatial_dims)
    : Layer(device), channels_(channels), spatial_dims_(spatial_dims) {}

std::string BatchNorm::Describe() const {
  return absl::StrCat(spatial_dims_ == 0 ? "BatchNorm1d(" : "BatchNorm2d(", channels_, ")");
}

kernels::BatchNormShape BatchNorm::ShapeFor(const Shape& input) const {
  kernels::BatchNormShape s;
  s.batch = input[0];
  s.channels = input[1];
  s.spatial = 1;
  for (size_t i = 2; i < input.size(); ++i) s.spatial *= input[i];
  return s;
}

absl::StatusOr<Shape> BatchNorm::OutputShape(const Shape& input) const {
  if (static_cast<int>(input.size()) != 2 + spatial_dims_ || input[1] != channels_) {
    return BadInput(Describe(), input,
                    spatial_dims_ == 0 ? absl::StrCat("expected [N, ", channels_, "]")
                                       : absl::StrCat("expected [N, ", channels_, ", H, W]"));
  }
  if (NumElements(input) < 1) return BadInput(Describe(), input, "empty input");
  return input;
}

void BatchNorm::Declare(const std::string& prefix, TensorDecls* decls) {
  AddParameter(decls, prefix + "weight", {channels_}, InitKind::kOnes, 0, 0, &gamma_, &gamma_grad_);
  AddParameter(decls, prefix + "bias", {channels_}, InitKind::kZeros, 0, 0, &beta_, &beta_grad_);
  AddBuffer(decls, prefix + "running_mean", {channels_}, InitKind::kZeros, &running_mean_);
  AddBuffer(decls, prefix + "running_var", {channels_}, InitKind::kOnes, &running_var_);
  AddBuffer(decls, prefix + "num_batches_tracked", {}, InitKind::kZeros, &num_batches_tracked_);
}

absl::StatusOr<Tensor> BatchNorm::Forward(const Tensor& x, Mode mode) {
  PS_RETURN_IF_ERROR(CheckDevice(Describe(), x, device()));
  PS_ASSIGN_OR_RETURN(Shape out_shape, OutputShape(x.shape()));
  PS_ASSIGN_OR_RETURN(Tensor y, y_.Get(device(), out_shape));
  const kernels::BatchNormShape s = ShapeFor(x.shape());
  if (mode == Mode::kInference) {
    PS_RETURN_IF_ERROR(kernels::BatchNormForwardInference(
        *device(), s, kEps, x.data<float>(), gamma_.data<float>(), beta_.data<float>(),
        running_mean_.data<float>(), running_var_.data<float>(), MutableF32(y)));
    have_batch_stats_ = false;
    return y;
  }
  if (save_mean_.empty()) {
    PS_ASSIGN_OR_RETURN(save_mean_, Tensor::Empty(device(), {channels_}));
    PS_ASSIGN_OR_RETURN(save_inv_std_, Tensor::Empty(device(), {channels_}));
    PS_ASSIGN_OR_RETURN(one_, Tensor::Empty(device(), {1}));
    PS_RETURN_IF_ERROR(kernels::Fill(*device(), 1, 1.0f, MutableF32(one_)));
  }
  PS_RETURN_IF_ERROR(kernels::BatchNormForwardTraining(
      *device(), s, kEps, kMomentum, x.data<float>(), gamma_.data<float>(), beta_.data<float>(),
      MutableF32(y), MutableF32(save_mean_), MutableF32(save_inv_std_), MutableF32(running_mean_),
      MutableF32(running_var_)));
  // PyTorch counts training batches; with a fixed momentum the count does not
  // enter the computation, but it is part of the state dict.
  PS_RETURN_IF_ERROR(
      kernels::Axpy(*device(), 1, 1.0f, one_.data<float>(), MutableF32(num_batches_tracked_)));
  have_batch_stats_ = true;
  x_ = x;
  return y;
}

absl::StatusOr<Tensor> BatchNorm::Backward(const Tensor& dy, bool need_dx) {
  if (!have_batch_stats_) {
    return absl::FailedPreconditionError(
        absl::StrCat(Describe(), ": Backward needs a training-mode Forward first"));
  }
  PS_RETURN_IF_ERROR(CheckGradShape(Describe(), dy, x_.shape()));
  // The kernel always produces dx; without need_dx it goes to the buffer
  // anyway and is not returned.
  PS_ASSIGN_OR_RETURN(Tensor dx, dx_.Get(device(), x_.shape()));
  PS_RETURN_IF_ERROR(kernels::BatchNormBackward(
      *device(), ShapeFor(x_.shape()), x_.data<float>(), gamma_.data<float>(),
      save_mean_.data<float>(), save_inv_std_.data<float>(), dy.data<float>(), MutableF32(dx),
      MutableF32(gamma_grad_), MutableF32(beta_grad_)));
  if (!need_dx) return Tensor();
  return dx;
}

}  // namespace ps::worker::model
