#include "worker/model/pool_layer.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ps::worker::model {

using internal::BadInput;
using internal::CheckDevice;
using internal::CheckGradShape;
using internal::NoForward;

// --- Pool2d::Window ---

std::string Pool2d::Window::Describe() const {
  return absl::StrCat(kind == Kind::kMax ? "MaxPool2d" : "AvgPool2d", "(kernel=", kernel,
                      ", stride=", stride, ", pad=", pad, ")");
}

kernels::Pool2dShape Pool2d::Window::ShapeFor(const Shape& input) const {
  kernels::Pool2dShape s;
  s.batch = input[0];
  s.channels = input[1];
  s.height = input[2];
  s.width = input[3];
  s.kernel_h = s.kernel_w = kernel;
  s.stride_h = s.stride_w = stride;
  s.pad_h = s.pad_w = pad;
  return s;
}

absl::StatusOr<Shape> Pool2d::Window::OutputShape(const std::string& layer,
                                                  const Shape& input) const {
  if (input.size() != 4) return BadInput(layer, input, "expected [N, C, H, W]");
  const kernels::Pool2dShape s = ShapeFor(input);
  absl::Status valid = kernels::ValidatePool2dShape(s);
  if (!valid.ok()) return BadInput(layer, input, valid.message());
  if (s.out_height() < 1 || s.out_width() < 1) {
    return BadInput(layer, input, "output would be empty");
  }
  return Shape{s.batch, s.channels, s.out_height(), s.out_width()};
}

// --- Pool2d ---

Pool2d::Pool2d(Device* device, Kind kind, int64_t kernel, int64_t stride, int64_t pad)
    : Layer(device), window_{kind, kernel, stride, pad} {}

absl::StatusOr<Shape> Pool2d::OutputShape(const Shape& input) const {
  return window_.OutputShape(Describe(), input);
}

absl::StatusOr<Tensor> Pool2d::Forward(const Tensor& x, Mode mode) {
  PS_RETURN_IF_ERROR(CheckDevice(Describe(), x, device()));
  PS_ASSIGN_OR_RETURN(Shape out_shape, OutputShape(x.shape()));
  PS_ASSIGN_OR_RETURN(Tensor y, y_.Get(device(), out_shape));
  const kernels::Pool2dShape s = window_.ShapeFor(x.shape());
  if (window_.kind == Kind::kMax) {
    PS_ASSIGN_OR_RETURN(Tensor argmax, argmax_.Get(device(), out_shape, DType::kI32));
    PS_RETURN_IF_ERROR(kernels::MaxPool2dForward(*device(), s, x.data<float>(), MutableF32(y),
                                                 MutableI32(argmax)));
  } else {
    PS_RETURN_IF_ERROR(kernels::AvgPool2dForward(*device(), s, x.data<float>(), MutableF32(y)));
  }
  x_shape_ = x.shape();
  return y;
}

absl::StatusOr<Tensor> Pool2d::Backward(const Tensor& dy, bool need_dx) {
  if (x_shape_.empty()) return NoForward(Describe());
  PS_ASSIGN_OR_RETURN(Shape out_shape, OutputShape(x_shape_));
  PS_RETURN_IF_ERROR(CheckGradShape(Describe(), dy, out_shape));
  if (!need_dx) return Tensor();
  PS_ASSIGN_OR_RETURN(Tensor dx, dx_.Get(device(), x_shape_));
  const kernels::Pool2dShape s = window_.ShapeFor(x_shape_);
  if (window_.kind == Kind::kMax) {
    PS_ASSIGN_OR_RETURN(Tensor argmax, argmax_.Get(device(), out_shape, DType::kI32));
    PS_RETURN_IF_ERROR(kernels::MaxPool2dBackward(*device(), s, dy.data<float>(),
                                                  argmax.data<int32_t>(), MutableF32(dx)));
  } else {
    PS_RETURN_IF_ERROR(kernels::AvgPool2dBackward(*device(), s, dy.data<float>(), MutableF32(dx)));
  }
  return dx;
}

// --- GlobalAvgPool2d ---

GlobalAvgPool2d::GlobalAvgPool2d(Device* device) : Layer(device) {}

kernels::Pool2dShape GlobalAvgPool2d::ShapeFor(const Shape& input) const {
  // One window covering the whole plane: the plane's mean.
  kernels::Pool2dShape s;
  s.batch = input[0];
  s.channels = input[1];
  s.height = s.kernel_h = s.stride_h = input[2];
  s.width = s.kernel_w = s.stride_w = input[3];
  return s;
}

absl::StatusOr<Shape> GlobalAvgPool2d::OutputShape(const Shape& input) const {
  if (input.size() != 4 || input[0] < 1 || input[1] < 1 || input[2] < 1 || input[3] < 1) {
    return BadInput(Describe(), input, "expected non-empty [N, C, H, W]");
  }
  return Shape{input[0], input[1], 1, 1};
}

absl::StatusOr<Tensor> GlobalAvgPool2d::Forward(const Tensor& x, Mode mode) {
  PS_RETURN_IF_ERROR(CheckDevice(Describe(), x, device()));
  PS_ASSIGN_OR_RETURN(Shape out_shape, OutputShape(x.shape()));
  PS_ASSIGN_OR_RETURN(Tensor y, y_.Get(device(), out_shape));
  if (x.dim(2) == 1 && x.dim(3) == 1) {
    PS_RETURN_IF_ERROR(y.CopyFrom(x));  // a 1x1 plane is its own mean
  } else {
    PS_RETURN_IF_ERROR(
        kernels::AvgPool2dForward(*device(), ShapeFor(x.shape()), x.data<float>(), MutableF32(y)));
  }
  x_shape_ = x.shape();
  return y;
}

absl::StatusOr<Tensor> GlobalAvgPool2d::Backward(const Tensor& dy, bool need_dx) {
  if (x_shape_.empty()) return NoForward(Describe());
  PS_ASSIGN_OR_RETURN(Shape out_shape, OutputShape(x_shape_));
  PS_RETURN_IF_ERROR(CheckGradShape(Describe(), dy, out_shape));
  if (!need_dx) return Tensor();
  PS_ASSIGN_OR_RETURN(Tensor dx, dx_.Get(device(), x_shape_));
  if (x_shape_[2] == 1 && x_shape_[3] == 1) {
    PS_RETURN_IF_ERROR(dx.CopyFrom(dy));
  } else {
    PS_RETURN_IF_ERROR(kernels::AvgPool2dBackward(*device(), ShapeFor(x_shape_), dy.data<float>(),
                                                  MutableF32(dx)));
  }
  return dx;
}

// --- ActivationThenPool ---

namespace internal {

std::string ActivationThenPool::Describe() const {
  return absl::StrCat(Activation::Name(activation), "+", window.Describe());
}

absl::StatusOr<Shape> ActivationThenPool::OutputShape(const Shape& input) const {
  return window.OutputShape(Describe(), input);
}

kernels::PoolActivation ActivationThenPool::kernel_activation() const {
  return activation == Activation::Kind::kRelu ? kernels::PoolActivation::kRelu
                                               : kernels::PoolActivation::kSigmoid;
}

}  // namespace internal

// --- ActivationPool2d ---

ActivationPool2d::ActivationPool2d(Device* device, Activation::Kind activation, Pool2d::Kind pool,
                                   int64_t kernel, int64_t stride, int64_t pad)
    : Layer(device), spec_{activation, {pool, kernel, stride, pad}} {}

absl::StatusOr<Shape> ActivationPool2d::OutputShape(const Shape& input) const {
  return spec_.OutputShape(input);
}

absl::StatusOr<Tensor> ActivationPool2d::Forward(const Tensor& x, Mode mode) {
  PS_RETURN_IF_ERROR(CheckDevice(Describe(), x, device()));
  PS_ASSIGN_OR_RETURN(Shape out_shape, OutputShape(x.shape()));
  PS_ASSIGN_OR_RETURN(Tensor a, a_.Get(device(), x.shape()));
  PS_ASSIGN_OR_RETURN(Tensor y, y_.Get(device(), out_shape));
  const kernels::Pool2dShape s = spec_.window.ShapeFor(x.shape());
  const kernels::PoolActivation act = spec_.kernel_activation();
  if (spec_.window.kind == Pool2d::Kind::kMax) {
    PS_ASSIGN_OR_RETURN(Tensor argmax, argmax_.Get(device(), out_shape, DType::kI32));
    PS_RETURN_IF_ERROR(kernels::ActivationMaxPool2dForward(*device(), act, s, x.data<float>(),
                                                           MutableF32(a), MutableF32(y),
                                                           MutableI32(argmax)));
  } else {
    PS_RETURN_IF_ERROR(kernels::ActivationAvgPool2dForward(*device(), act, s, x.data<float>(),
                                                           MutableF32(a), MutableF32(y)));
  }
  x_shape_ = x.shape();
  a_view_ = a;
  return y;
}

absl::StatusOr<Tensor> ActivationPool2d::Backward(const Tensor& dy, bool need_dx) {
  if (a_view_.empty()) return NoForward(Describe());
  PS_ASSIGN_OR_RETURN(Shape out_shape, OutputShape(x_shape_));
  PS_RETURN_IF_ERROR(CheckGradShape(Describe(), dy, out_shape));
  if (!need_dx) return Tensor();
  PS_ASSIGN_OR_RETURN(Tensor dx, dx_.Get(device(), x_shape_));
  const kernels::Pool2dShape s = spec_.window.ShapeFor(x_shape_);
  const kernels::PoolActivation act = spec_.kernel_activation();
  if (spec_.window.kind == Pool2d::Kind::kMax) {
    PS_ASSIGN_OR_RETURN(Tensor argmax, argmax_.Get(device(), out_shape, DType::kI32));
    PS_RETURN_IF_ERROR(kernels::ActivationMaxPool2dBackward(*device(), act, s, a_view_.data<float>(),
                                                            dy.data<float>(),
                                                            argmax.data<int32_t>(), MutableF32(dx)));
  } else {
    PS_RETURN_IF_ERROR(kernels::ActivationAvgPool2dBackward(
        *device(), act, s, a_view_.data<float>(), dy.data<float>(), MutableF32(dx)));
  }
  return dx;
}

}  // namespace ps::worker::model
