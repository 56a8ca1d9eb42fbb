#include "worker/model/layer.h"

#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/rng.h"
#include "common/status_macros.h"
#include "kernels/activation.h"
#include "kernels/activation_pool.h"
#include "kernels/elementwise.h"
#include "kernels/linear.h"

namespace ps::worker::model {
namespace {

absl::Status BadInput(const std::string& layer, const Shape& input, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat(layer, " cannot take input ", ShapeToString(input), ": ", why));
}

// A square pooling window over an [N, C, H, W] input.
kernels::Pool2dShape PoolShapeFor(const Shape& input, int64_t kernel, int64_t stride,
                                  int64_t pad) {
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

// A square convolution over an [N, C, H, W] input.
kernels::Conv2dShape ConvShapeFor(const Shape& input, int64_t out_channels, int64_t kernel,
                                  int64_t stride, int64_t pad) {
  kernels::Conv2dShape s;
  s.batch = input[0];
  s.in_channels = input[1];
  s.height = input[2];
  s.width = input[3];
  s.out_channels = out_channels;
  s.kernel_h = s.kernel_w = kernel;
  s.stride_h = s.stride_w = stride;
  s.pad_h = s.pad_w = pad;
  return s;
}

absl::Status NoForward(const std::string& layer) {
  return absl::FailedPreconditionError(absl::StrCat(layer, ": Backward without Forward"));
}

// dy must have the shape of the last forward's output.
absl::Status CheckGradShape(const std::string& layer, const Tensor& dy, const Shape& expected) {
  if (dy.shape() != expected) {
    return absl::InvalidArgumentError(absl::StrCat(layer, ": gradient of shape ",
                                                   ShapeToString(dy.shape()), ", expected ",
                                                   ShapeToString(expected)));
  }
  return absl::OkStatus();
}

absl::Status CheckDevice(const std::string& layer, const Tensor& x, Device* device) {
  if (x.device() != device) {
    return absl::InvalidArgumentError(absl::StrCat(layer, ": tensor on ",
                                                   x.device() ? x.device()->name() : "no device",
                                                   ", layer on ", device->name()));
  }
  if (x.dtype() != DType::kF32) {
    return absl::InvalidArgumentError(
        absl::StrCat(layer, ": activations must be F32, got ", DTypeName(x.dtype())));
  }
  return absl::OkStatus();
}

void AddParameter(TensorDecls* decls, std::string name, Shape shape, InitKind init, int64_t fan_in,
                  int64_t fan_out, Tensor* value, Tensor* grad) {
  TensorSlot slot;
  slot.spec = ParamSpec{std::move(name), std::move(shape), DType::kF32};
  slot.init = init;
  slot.fan_in = fan_in;
  slot.fan_out = fan_out;
  slot.value = value;
  slot.grad = grad;
  decls->parameters.push_back(std::move(slot));
}

void AddBuffer(TensorDecls* decls, std::string name, Shape shape, InitKind init, Tensor* value) {
  TensorSlot slot;
  slot.spec = ParamSpec{std::move(name), std::move(shape), DType::kF32};
  slot.init = init;
  slot.value = value;
  decls->buffers.push_back(std::move(slot));
}

}  // namespace

// --- ActivationBuffer ---

absl::StatusOr<Tensor> ActivationBuffer::Get(Device* device, const Shape& shape, DType dtype) {
  const int64_t n = NumElements(shape);
  if (storage_.empty() || storage_.device() != device || storage_.dtype() != dtype ||
      storage_.num_elements() < n) {
    PS_ASSIGN_OR_RETURN(storage_, Tensor::Empty(device, {n}, dtype));
  }
  return storage_.View(0, shape);
}

// --- Conv2d ---

Conv2d::Conv2d(Device* device, int64_t in_channels, int64_t out_channels, int64_t kernel,
               int64_t stride, int64_t pad)
    : Layer(device),
      in_channels_(in_channels),
      out_channels_(out_channels),
      kernel_(kernel),
      stride_(stride),
      pad_(pad) {}

std::string Conv2d::Describe() const {
  return absl::StrCat("Conv2d(", in_channels_, ", ", out_channels_, ", kernel=", kernel_,
                      ", stride=", stride_, ", pad=", pad_, ")");
}

kernels::Conv2dShape Conv2d::ShapeFor(const Shape& input) const {
  return ConvShapeFor(input, out_channels_, kernel_, stride_, pad_);
}

absl::StatusOr<Shape> Conv2d::OutputShape(const Shape& input) const {
  if (input.size() != 4) return BadInput(Describe(), input, "expected [N, C, H, W]");
  if (input[1] != in_channels_) {
    return BadInput(Describe(), input, absl::StrCat("expected ", in_channels_, " channels"));
  }
  const kernels::Conv2dShape s = ShapeFor(input);
  absl::Status valid = kernels::ValidateConv2dShape(s);
  if (!valid.ok()) return BadInput(Describe(), input, valid.message());
  return Shape{s.batch, out_channels_, s.out_height(), s.out_width()};
}

void Conv2d::Declare(const std::string& prefix, TensorDecls* decls) {
  const int64_t area = kernel_ * kernel_;
  AddParameter(decls, prefix + "weight", {out_channels_, in_channels_, kernel_, kernel_},
               InitKind::kXavierUniform, in_channels_ * area, out_channels_ * area, &weight_,
               &weight_grad_);
  AddParameter(decls, prefix + "bias", {out_channels_}, InitKind::kZeros, 0, 0, &bias_,
               &bias_grad_);
}

absl::StatusOr<Tensor> Conv2d::Forward(const Tensor& x, Mode mode) {
  PS_RETURN_IF_ERROR(CheckDevice(Describe(), x, device()));
  PS_ASSIGN_OR_RETURN(Shape out_shape, OutputShape(x.shape()));
  PS_ASSIGN_OR_RETURN(Tensor y, y_.Get(device(), out_shape));
  PS_RETURN_IF_ERROR(kernels::Conv2dForward(*device(), ShapeFor(x.shape()), x.data<float>(),
                                            weight_.data<float>(), bias_.data<float>(),
                                            MutableF32(y)));
  x_ = x;
  return y;
}

absl::StatusOr<Tensor> Conv2d::Backward(const Tensor& dy, bool need_dx) {
  if (x_.empty()) return NoForward(Describe());
  PS_ASSIGN_OR_RETURN(Shape out_shape, OutputShape(x_.shape()));
  PS_RETURN_IF_ERROR(CheckGradShape(Describe(), dy, out_shape));
  Tensor dx;
  if (need_dx) {
    PS_ASSIGN_OR_RETURN(dx, dx_.Get(device(), x_.shape()));
  }
  PS_RETURN_IF_ERROR(kernels::Conv2dBackward(
      *device(), ShapeFor(x_.shape()), x_.data<float>(), weight_.data<float>(), dy.data<float>(),
      need_dx ? MutableF32(dx) : nullptr, MutableF32(weight_grad_), MutableF32(bias_grad_)));
  return dx;
}

// --- Linear ---

Linear::Linear(Device* device, int64_t in_features, int64_t out_features)
    : Layer(device), in_features_(in_features), out_features_(out_features) {}

std::string Linear::Describe() const {
  return absl::StrCat("Linear(", in_features_, ", ", out_features_, ")");
}

absl::StatusOr<Shape> Linear::OutputShape(const Shape& input) const {
  if (input.size() != 2 || input[1] != in_features_) {
    return BadInput(Describe(), input, absl::StrCat("expected [N, ", in_features_, "]"));
  }
  if (input[0] < 1) return BadInput(Describe(), input, "empty batch");
  return Shape{input[0], out_features_};
}

void Linear::Declare(const std::string& prefix, TensorDecls* decls) {
  AddParameter(decls, prefix + "weight", {out_features_, in_features_}, InitKind::kXavierUniform,
               in_features_, out_features_, &weight_, &weight_grad_);
  AddParameter(decls, prefix + "bias", {out_features_}, InitKind::kZeros, 0, 0, &bias_,
               &bias_grad_);
}

absl::StatusOr<Tensor> Linear::Forward(const Tensor& x, Mode mode) {
  PS_RETURN_IF_ERROR(CheckDevice(Describe(), x, device()));
  PS_ASSIGN_OR_RETURN(Shape out_shape, OutputShape(x.shape()));
  PS_ASSIGN_OR_RETURN(Tensor y, y_.Get(device(), out_shape));
  PS_RETURN_IF_ERROR(kernels::LinearForward(*device(), x.dim(0), in_features_, out_features_,
                                            x.data<float>(), weight_.data<float>(),
                                            bias_.data<float>(), MutableF32(y)));
  x_ = x;
  return y;
}

absl::StatusOr<Tensor> Linear::Backward(const Tensor& dy, bool need_dx) {
  if (x_.empty()) return NoForward(Describe());
  PS_RETURN_IF_ERROR(CheckGradShape(Describe(), dy, {x_.dim(0), out_features_}));
  Tensor dx;
  if (need_dx) {
    PS_ASSIGN_OR_RETURN(dx, dx_.Get(device(), x_.shape()));
  }
  PS_RETURN_IF_ERROR(kernels::LinearBackward(*device(), x_.dim(0), in_features_, out_features_,
                                             x_.data<float>(), weight_.data<float>(),
                                             dy.data<float>(), need_dx ? MutableF32(dx) : nullptr,
                                             MutableF32(weight_grad_), MutableF32(bias_grad_)));
  return dx;
}

// --- Pool2d ---

Pool2d::Pool2d(Device* device, Kind kind, int64_t kernel, int64_t stride, int64_t pad)
    : Layer(device), kind_(kind), kernel_(kernel), stride_(stride), pad_(pad) {}

std::string Pool2d::Describe() const {
  return absl::StrCat(kind_ == Kind::kMax ? "MaxPool2d" : "AvgPool2d", "(kernel=", kernel_,
                      ", stride=", stride_, ", pad=", pad_, ")");
}

kernels::Pool2dShape Pool2d::ShapeFor(const Shape& input) const {
  return PoolShapeFor(input, kernel_, stride_, pad_);
}

absl::StatusOr<Shape> Pool2d::OutputShape(const Shape& input) const {
  if (input.size() != 4) return BadInput(Describe(), input, "expected [N, C, H, W]");
  const kernels::Pool2dShape s = ShapeFor(input);
  absl::Status valid = kernels::ValidatePool2dShape(s);
  if (!valid.ok()) return BadInput(Describe(), input, valid.message());
  if (s.out_height() < 1 || s.out_width() < 1) {
    return BadInput(Describe(), input, "output would be empty");
  }
  return Shape{s.batch, s.channels, s.out_height(), s.out_width()};
}

absl::StatusOr<Tensor> Pool2d::Forward(const Tensor& x, Mode mode) {
  PS_RETURN_IF_ERROR(CheckDevice(Describe(), x, device()));
  PS_ASSIGN_OR_RETURN(Shape out_shape, OutputShape(x.shape()));
  PS_ASSIGN_OR_RETURN(Tensor y, y_.Get(device(), out_shape));
  const kernels::Pool2dShape s = ShapeFor(x.shape());
  if (kind_ == Kind::kMax) {
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
  const kernels::Pool2dShape s = ShapeFor(x_shape_);
  if (kind_ == Kind::kMax) {
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

// --- Activation ---

Activation::Activation(Device* device, Kind kind) : Layer(device), kind_(kind) {}

std::string Activation::Describe() const { return kind_ == Kind::kRelu ? "ReLU" : "Sigmoid"; }

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

// --- ActivationPool2d ---

ActivationPool2d::ActivationPool2d(Device* device, Activation::Kind activation, Pool2d::Kind pool,
                                   int64_t kernel, int64_t stride, int64_t pad)
    : Layer(device),
      activation_(activation),
      pool_kind_(pool),
      kernel_(kernel),
      stride_(stride),
      pad_(pad) {}

std::string ActivationPool2d::Describe() const {
  return absl::StrCat(activation_ == Activation::Kind::kRelu ? "ReLU+" : "Sigmoid+",
                      pool_kind_ == Pool2d::Kind::kMax ? "MaxPool2d" : "AvgPool2d",
                      "(kernel=", kernel_, ", stride=", stride_, ", pad=", pad_, ")");
}

absl::StatusOr<Shape> ActivationPool2d::OutputShape(const Shape& input) const {
  if (input.size() != 4) return BadInput(Describe(), input, "expected [N, C, H, W]");
  const kernels::Pool2dShape s = PoolShapeFor(input, kernel_, stride_, pad_);
  absl::Status valid = kernels::ValidatePool2dShape(s);
  if (!valid.ok()) return BadInput(Describe(), input, valid.message());
  if (s.out_height() < 1 || s.out_width() < 1) {
    return BadInput(Describe(), input, "output would be empty");
  }
  return Shape{s.batch, s.channels, s.out_height(), s.out_width()};
}

absl::StatusOr<Tensor> ActivationPool2d::Forward(const Tensor& x, Mode mode) {
  PS_RETURN_IF_ERROR(CheckDevice(Describe(), x, device()));
  PS_ASSIGN_OR_RETURN(Shape out_shape, OutputShape(x.shape()));
  PS_ASSIGN_OR_RETURN(Tensor a, a_.Get(device(), x.shape()));
  PS_ASSIGN_OR_RETURN(Tensor y, y_.Get(device(), out_shape));
  const kernels::Pool2dShape s = PoolShapeFor(x.shape(), kernel_, stride_, pad_);
  const kernels::PoolActivation act = activation_ == Activation::Kind::kRelu
                                          ? kernels::PoolActivation::kRelu
                                          : kernels::PoolActivation::kSigmoid;
  if (pool_kind_ == Pool2d::Kind::kMax) {
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
  const kernels::Pool2dShape s = PoolShapeFor(x_shape_, kernel_, stride_, pad_);
  const kernels::PoolActivation act = activation_ == Activation::Kind::kRelu
                                          ? kernels::PoolActivation::kRelu
                                          : kernels::PoolActivation::kSigmoid;
  if (pool_kind_ == Pool2d::Kind::kMax) {
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

// --- Conv2dActivationPool ---

Conv2dActivationPool::Conv2dActivationPool(Device* device, int64_t in_channels,
                                           int64_t out_channels, int64_t kernel, int64_t stride,
                                           int64_t pad, Activation::Kind activation,
                                           Pool2d::Kind pool, int64_t pool_kernel,
                                           int64_t pool_stride, int64_t pool_pad)
    : Layer(device),
      in_channels_(in_channels),
      out_channels_(out_channels),
      kernel_(kernel),
      stride_(stride),
      pad_(pad),
      activation_(activation),
      pool_kind_(pool),
      pool_kernel_(pool_kernel),
      pool_stride_(pool_stride),
      pool_pad_(pool_pad),
      conv_shapes_(device, in_channels, out_channels, kernel, stride, pad),
      activation_shapes_(device, activation, pool, pool_kernel, pool_stride, pool_pad) {}

std::string Conv2dActivationPool::Describe() const {
  return absl::StrCat(conv_shapes_.Describe(), "+", activation_shapes_.Describe());
}

absl::StatusOr<Shape> Conv2dActivationPool::OutputShape(const Shape& input) const {
  absl::StatusOr<Shape> conv = conv_shapes_.OutputShape(input);
  if (!conv.ok()) return BadInput(Describe(), input, conv.status().message());
  absl::StatusOr<Shape> pooled = activation_shapes_.OutputShape(*conv);
  if (!pooled.ok()) return BadInput(Describe(), input, pooled.status().message());
  return pooled;
}

void Conv2dActivationPool::Declare(const std::string& prefix, TensorDecls* decls) {
  const int64_t area = kernel_ * kernel_;
  AddParameter(decls, prefix + "weight", {out_channels_, in_channels_, kernel_, kernel_},
               InitKind::kXavierUniform, in_channels_ * area, out_channels_ * area, &weight_,
               &weight_grad_);
  AddParameter(decls, prefix + "bias", {out_channels_}, InitKind::kZeros, 0, 0, &bias_,
               &bias_grad_);
}

kernels::ConvActivationPool Conv2dActivationPool::EpilogueFor(const Shape& conv_output) const {
  kernels::ConvActivationPool e;
  e.activation = activation_ == Activation::Kind::kRelu ? kernels::PoolActivation::kRelu
                                                        : kernels::PoolActivation::kSigmoid;
  e.max = pool_kind_ == Pool2d::Kind::kMax;
  e.pool = PoolShapeFor(conv_output, pool_kernel_, pool_stride_, pool_pad_);
  return e;
}

absl::StatusOr<Tensor> Conv2dActivationPool::Forward(const Tensor& x, Mode mode) {
  PS_RETURN_IF_ERROR(CheckDevice(Describe(), x, device()));
  PS_ASSIGN_OR_RETURN(Shape out_shape, OutputShape(x.shape()));
  PS_ASSIGN_OR_RETURN(Shape conv_shape, conv_shapes_.OutputShape(x.shape()));
  PS_ASSIGN_OR_RETURN(Tensor a, a_.Get(device(), conv_shape));
  PS_ASSIGN_OR_RETURN(Tensor y, y_.Get(device(), out_shape));
  const kernels::ConvActivationPool e = EpilogueFor(conv_shape);
  int32_t* argmax = nullptr;
  if (e.max) {
    PS_ASSIGN_OR_RETURN(Tensor t, argmax_.Get(device(), out_shape, DType::kI32));
    argmax = MutableI32(t);
  }
  PS_RETURN_IF_ERROR(kernels::Conv2dActivationPoolForward(
      *device(), ConvShapeFor(x.shape(), out_channels_, kernel_, stride_, pad_), e,
      x.data<float>(), weight_.data<float>(), bias_.data<float>(), MutableF32(a), MutableF32(y),
      argmax));
  x_ = x;
  a_view_ = a;
  return y;
}

absl::StatusOr<Tensor> Conv2dActivationPool::Backward(const Tensor& dy, bool need_dx) {
  if (x_.empty()) return NoForward(Describe());
  PS_ASSIGN_OR_RETURN(Shape out_shape, OutputShape(x_.shape()));
  PS_RETURN_IF_ERROR(CheckGradShape(Describe(), dy, out_shape));
  Tensor dx;
  if (need_dx) {
    PS_ASSIGN_OR_RETURN(dx, dx_.Get(device(), x_.shape()));
  }
  const kernels::ConvActivationPool e = EpilogueFor(a_view_.shape());
  const int32_t* argmax = nullptr;
  if (e.max) {
    PS_ASSIGN_OR_RETURN(Tensor t, argmax_.Get(device(), out_shape, DType::kI32));
    argmax = t.data<int32_t>();
  }
  PS_RETURN_IF_ERROR(kernels::Conv2dActivationPoolBackward(
      *device(), ConvShapeFor(x_.shape(), out_channels_, kernel_, stride_, pad_), e,
      x_.data<float>(), weight_.data<float>(), a_view_.data<float>(), dy.data<float>(), argmax,
      need_dx ? MutableF32(dx) : nullptr, MutableF32(weight_grad_), MutableF32(bias_grad_)));
  return dx;
}

// --- BatchNorm ---

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

// --- Flatten ---

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

// --- Sequential ---

Layer* Sequential::Add(std::string name, std::unique_ptr<Layer> layer) {
  Layer* raw = layer.get();
  layers_.emplace_back(std::move(name), std::move(layer));
  return raw;
}

absl::StatusOr<Shape> Sequential::OutputShape(const Shape& input) const {
  Shape shape = input;
  for (const auto& [name, layer] : layers_) {
    PS_ASSIGN_OR_RETURN(shape, layer->OutputShape(shape));
  }
  return shape;
}

void Sequential::Declare(const std::string& prefix, TensorDecls* decls) {
  for (const auto& [name, layer] : layers_) {
    layer->Declare(name.empty() ? prefix : absl::StrCat(prefix, name, "."), decls);
  }
}

absl::StatusOr<Tensor> Sequential::Forward(const Tensor& x, Mode mode) {
  Tensor h = x;
  for (const auto& [name, layer] : layers_) {
    PS_ASSIGN_OR_RETURN(h, layer->Forward(h, mode));
  }
  return h;
}

absl::StatusOr<Tensor> Sequential::Backward(const Tensor& dy, bool need_dx) {
  Tensor g = dy;
  for (size_t i = layers_.size(); i-- > 0;) {
    // Every layer but the first needs its input gradient for the one below.
    PS_ASSIGN_OR_RETURN(g, layers_[i].second->Backward(g, i > 0 || need_dx));
  }
  return g;
}

// --- Residual ---

Residual::Residual(Device* device, int64_t in_channels, int64_t out_channels, bool use_1x1conv,
                   int64_t stride)
    : Layer(device),
      in_channels_(in_channels),
      out_channels_(out_channels),
      stride_(stride),
      conv1_(device, in_channels, out_channels, 3, stride, 1),
      bn1_(device, out_channels, 2),
      relu1_(device, Activation::Kind::kRelu),
      conv2_(device, out_channels, out_channels, 3, 1, 1),
      bn2_(device, out_channels, 2),
      conv3_(use_1x1conv ? std::make_unique<Conv2d>(device, in_channels, out_channels, 1, stride)
                         : nullptr),
      relu2_(device, Activation::Kind::kRelu) {}

std::string Residual::Describe() const {
  return absl::StrCat("Residual(", in_channels_, ", ", out_channels_,
                      ", use_1x1conv=", conv3_ ? "true" : "false", ", stride=", stride_, ")");
}

absl::StatusOr<Shape> Residual::OutputShape(const Shape& input) const {
  if (!conv3_ && (in_channels_ != out_channels_ || stride_ != 1)) {
    return BadInput(Describe(), input, "an identity shortcut needs in == out channels, stride 1");
  }
  PS_ASSIGN_OR_RETURN(Shape main, conv1_.OutputShape(input));
  PS_ASSIGN_OR_RETURN(main, conv2_.OutputShape(main));
  Shape shortcut = input;
  if (conv3_) {
    PS_ASSIGN_OR_RETURN(shortcut, conv3_->OutputShape(input));
  }
  if (main != shortcut) {
    return BadInput(Describe(), input,
                    absl::StrCat("main path gives ", ShapeToString(main), ", shortcut ",
                                 ShapeToString(shortcut)));
  }
  return main;
}

void Residual::Declare(const std::string& prefix, TensorDecls* decls) {
  // PyTorch's state_dict order is registration order: D2L's Residual
  // registers conv1, conv2, conv3, bn1, bn2. We follow it so that our
  // parameter order equals torch's parameters() order.
  conv1_.Declare(prefix + "conv1.", decls);
  conv2_.Declare(prefix + "conv2.", decls);
  if (conv3_) conv3_->Declare(prefix + "conv3.", decls);
  bn1_.Declare(prefix + "bn1.", decls);
  bn2_.Declare(prefix + "bn2.", decls);
}

absl::StatusOr<Tensor> Residual::Forward(const Tensor& x, Mode mode) {
  PS_RETURN_IF_ERROR(CheckDevice(Describe(), x, device()));
  PS_ASSIGN_OR_RETURN(Shape out_shape, OutputShape(x.shape()));
  PS_ASSIGN_OR_RETURN(Tensor h, conv1_.Forward(x, mode));
  PS_ASSIGN_OR_RETURN(h, bn1_.Forward(h, mode));
  PS_ASSIGN_OR_RETURN(h, relu1_.Forward(h, mode));
  PS_ASSIGN_OR_RETURN(h, conv2_.Forward(h, mode));
  PS_ASSIGN_OR_RETURN(h, bn2_.Forward(h, mode));
  Tensor shortcut = x;
  if (conv3_) {
    PS_ASSIGN_OR_RETURN(shortcut, conv3_->Forward(x, mode));
  }
  PS_ASSIGN_OR_RETURN(Tensor sum, sum_.Get(device(), out_shape));
  PS_RETURN_IF_ERROR(kernels::Add(*device(), sum.num_elements(), h.data<float>(),
                                  shortcut.data<float>(), MutableF32(sum)));
  return relu2_.Forward(sum, mode);
}

absl::StatusOr<Tensor> Residual::Backward(const Tensor& dy, bool need_dx) {
  // The sum's gradient flows into both the main path and the shortcut.
  PS_ASSIGN_OR_RETURN(Tensor dsum, relu2_.Backward(dy, true));
  PS_ASSIGN_OR_RETURN(Tensor g, bn2_.Backward(dsum, true));
  PS_ASSIGN_OR_RETURN(g, conv2_.Backward(g, true));
  PS_ASSIGN_OR_RETURN(g, relu1_.Backward(g, true));
  PS_ASSIGN_OR_RETURN(g, bn1_.Backward(g, true));
  PS_ASSIGN_OR_RETURN(Tensor dx_main, conv1_.Backward(g, need_dx));
  Tensor dx_shortcut = dsum;
  if (conv3_) {
    PS_ASSIGN_OR_RETURN(dx_shortcut, conv3_->Backward(dsum, need_dx));
  }
  if (!need_dx) return Tensor();
  PS_ASSIGN_OR_RETURN(Tensor dx, dx_.Get(device(), dx_main.shape()));
  PS_RETURN_IF_ERROR(kernels::Add(*device(), dx.num_elements(), dx_main.data<float>(),
                                  dx_shortcut.data<float>(), MutableF32(dx)));
  return dx;
}

// --- ParameterSet ---

absl::StatusOr<std::unique_ptr<ParameterSet>> ParameterSet::Create(Layer& root, Device* device) {
  std::unique_ptr<ParameterSet> set(new ParameterSet());
  root.Declare("", &set->decls_);
  for (const TensorSlot& slot : set->decls_.parameters) set->parameter_specs_.push_back(slot.spec);
  for (const TensorSlot& slot : set->decls_.buffers) set->buffer_specs_.push_back(slot.spec);

  const int64_t num_parameters = TotalElements(set->parameter_specs_);
  const int64_t num_buffers = TotalElements(set->buffer_specs_);
  PS_ASSIGN_OR_RETURN(set->flat_parameters_, Tensor::Empty(device, {num_parameters}));
  PS_ASSIGN_OR_RETURN(set->flat_gradients_, Tensor::Zeros(device, {num_parameters}));
  PS_ASSIGN_OR_RETURN(set->flat_buffers_, Tensor::Empty(device, {num_buffers}));

  int64_t offset = 0;
  for (TensorSlot& slot : set->decls_.parameters) {
    PS_ASSIGN_OR_RETURN(*slot.value, set->flat_parameters_.View(offset, slot.spec.shape));
    PS_ASSIGN_OR_RETURN(*slot.grad, set->flat_gradients_.View(offset, slot.spec.shape));
    if (!set->by_name_.emplace(slot.spec.name, *slot.value).second) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate tensor name ", slot.spec.name));
    }
    set->gradient_by_name_.emplace(slot.spec.name, *slot.grad);
    offset += NumElements(slot.spec.shape);
  }
  offset = 0;
  for (TensorSlot& slot : set->decls_.buffers) {
    PS_ASSIGN_OR_RETURN(*slot.value, set->flat_buffers_.View(offset, slot.spec.shape));
    if (!set->by_name_.emplace(slot.spec.name, *slot.value).second) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate tensor name ", slot.spec.name));
    }
    offset += NumElements(slot.spec.shape);
  }
  return set;
}

absl::StatusOr<Tensor> ParameterSet::Find(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) {
    return absl::NotFoundError(absl::StrCat("no parameter or buffer named ", name));
  }
  return it->second;
}

absl::StatusOr<Tensor> ParameterSet::FindGradient(const std::string& name) const {
  auto it = gradient_by_name_.find(name);
  if (it == gradient_by_name_.end()) {
    return absl::NotFoundError(absl::StrCat("no parameter named ", name));
  }
  return it->second;
}

namespace {

// Appends `slot`'s initial values to `out`.
void Fill(const TensorSlot& slot, SplitMix64& rng, std::vector<float>* out) {
  const int64_t n = NumElements(slot.spec.shape);
  switch (slot.init) {
    case InitKind::kZeros:
      out->insert(out->end(), n, 0.0f);
      return;
    case InitKind::kOnes:
      out->insert(out->end(), n, 1.0f);
      return;
    case InitKind::kXavierUniform: {
      const float bound =
          static_cast<float>(std::sqrt(6.0 / static_cast<double>(slot.fan_in + slot.fan_out)));
      for (int64_t i = 0; i < n; ++i) out->push_back((2.0f * rng.NextFloat() - 1.0f) * bound);
      return;
    }
  }
}

}  // namespace

absl::Status ParameterSet::Initialize(uint64_t seed) {
  SplitMix64 rng(seed);
  std::vector<float> values;
  values.reserve(flat_parameters_.num_elements());
  for (const TensorSlot& slot : decls_.parameters) Fill(slot, rng, &values);
  PS_RETURN_IF_ERROR(flat_parameters_.CopyFromHost(values));
  values.clear();
  for (const TensorSlot& slot : decls_.buffers) Fill(slot, rng, &values);
  return flat_buffers_.CopyFromHost(values);
}

}  // namespace ps::worker::model
