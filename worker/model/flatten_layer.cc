#include "worker/model/flatten_layer.h"

#include <utility>

#include "common/status_macros.h"

namespace ps::worker::model {

using internal::BadInput;
using internal::CheckGradShape;
using internal::NoForward;

absl::StatusOr<Shape> Flatten::OutputShape(const Shape& input) const {
  if (input.empty() || input[0] < 1) return BadInput(Describe(), input, "expected [N, ...]");
  return Shape{input[0], NumElements(input) / input[0]};
}

absl::StatusOr<Tensor> Flatten::Forward(const Tensor& x, Mode mode) {
  PS_ASSIGN_OR_RETURN(Shape out_shape, OutputShape(x.shape()));
  x_shape_ = x.shape();
  return x.Reshape(std::move(out_shape));
}

absl::StatusOr<Tensor> Flatten::Backward(const Tensor& dy, bool need_dx) {
  if (x_shape_.empty()) return NoForward(Describe());
  PS_ASSIGN_OR_RETURN(Shape out_shape, OutputShape(x_shape_));
  PS_RETURN_IF_ERROR(CheckGradShape(Describe(), dy, out_shape));
  if (!need_dx) return Tensor();
  return dy.Reshape(x_shape_);
}

}  // namespace ps::worker::model
