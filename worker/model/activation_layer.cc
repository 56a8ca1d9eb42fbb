#include "worker/model/activation_layer.h"

#include "common/status_macros.h"
#include "kernels/activation.h"

namespace ps::worker::model {

using internal::BadInput;
using internal::CheckDevice;
using internal::CheckGradShape;
using internal::NoForward;

std::string Activation::Name(Kind kind) { return kind == Kind::kRelu ? "ReLU" : "Sigmoid"; }

Activation::Activation(Device* device, Kind kind) : Layer(device), kind_(kind) {}

absl::StatusOr<Shape> Activation::OutputShape(const Shape& input) const {
  if (input.empty() || input[0] < 1) return BadInput(Describe(), input, "expected [N, ...]");
  return input;
}

absl::StatusOr<Tensor> Activation::Forward(const Tensor& x, Mode mode) {
  PS_RETURN_IF_ERROR(CheckDevice(Describe(), x, device()));
  PS_ASSIGN_OR_RETURN(Shape out_shape, OutputShape(x.shape()));
  PS_ASSIGN_OR_RETURN(Tensor y, y_.Get(device(), out_shape));
  if (kind_ == Kind::kRelu) {
    PS_RETURN_IF_ERROR(
        kernels::ReluForward(*device(), x.num_elements(), x.data<float>(), MutableF32(y)));
  } else {
    PS_RETURN_IF_ERROR(
        kernels::SigmoidForward(*device(), x.num_elements(), x.data<float>(), MutableF32(y)));
  }
  y_view_ = y;
  return y;
}

absl::StatusOr<Tensor> Activation::Backward(const Tensor& dy, bool need_dx) {
  if (y_view_.empty()) return NoForward(Describe());
  PS_RETURN_IF_ERROR(CheckGradShape(Describe(), dy, y_view_.shape()));
  if (!need_dx) return Tensor();
  PS_ASSIGN_OR_RETURN(Tensor dx, dx_.Get(device(), y_view_.shape()));
  const int64_t n = y_view_.num_elements();
  if (kind_ == Kind::kRelu) {
    PS_RETURN_IF_ERROR(kernels::ReluBackward(*device(), n, y_view_.data<float>(), dy.data<float>(),
                                             MutableF32(dx)));
  } else {
    PS_RETURN_IF_ERROR(kernels::SigmoidBackward(*device(), n, y_view_.data<float>(),
                                                dy.data<float>(), MutableF32(dx)));
  }
  return dx;
}

}  // namespace ps::worker::model
