#include "worker/model/conv_layer.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ps::worker::model {

using internal::BadInput;
using internal::BeginBackward;
using internal::CheckDevice;
using internal::NoForward;

// --- ConvParameters ---

namespace internal {

ConvParameters::ConvParameters(int64_t in_channels, int64_t out_channels, int64_t kernel,
                               int64_t stride, int64_t pad)
    : in_channels_(in_channels),
      out_channels_(out_channels),
      kernel_(kernel),
      stride_(stride),
      pad_(pad) {}

std::string ConvParameters::Describe() const {
  return absl::StrCat("Conv2d(", in_channels_, ", ", out_channels_, ", kernel=", kernel_,
                      ", stride=", stride_, ", pad=", pad_, ")");
}

kernels::Conv2dShape ConvParameters::ShapeFor(const Shape& input) const {
  kernels::Conv2dShape s;
  s.batch = input[0];
  s.in_channels = input[1];
  s.height = input[2];
  s.width = input[3];
  s.out_channels = out_channels_;
  s.kernel_h = s.kernel_w = kernel_;
  s.stride_h = s.stride_w = stride_;
  s.pad_h = s.pad_w = pad_;
  return s;
}

absl::StatusOr<Shape> ConvParameters::OutputShape(const Shape& input) const {
  if (input.size() != 4) return BadInput(Describe(), input, "expected [N, C, H, W]");
  if (input[1] != in_channels_) {
    return BadInput(Describe(), input, absl::StrCat("expected ", in_channels_, " channels"));
  }
  const kernels::Conv2dShape s = ShapeFor(input);
  absl::Status valid = kernels::ValidateConv2dShape(s);
  if (!valid.ok()) return BadInput(Describe(), input, valid.message());
  return Shape{s.batch, out_channels_, s.out_height(), s.out_width()};
}

void ConvParameters::Declare(const std::string& prefix, TensorDecls* decls) {
  const int64_t area = kernel_ * kernel_;
  AddParameter(decls, prefix + "weight", {out_channels_, in_channels_, kernel_, kernel_},
               InitKind::kXavierUniform, in_channels_ * area, out_channels_ * area, &weight_,
               &weight_grad_);
  AddParameter(decls, prefix + "bias", {out_channels_}, InitKind::kZeros, 0, 0, &bias_,
               &bias_grad_);
}

}  // namespace internal

// --- Conv2d ---

Conv2d::Conv2d(Device* device, int64_t in_channels, int64_t out_channels, int64_t kernel,
               int64_t stride, int64_t pad)
    : Layer(device), conv_(in_channels, out_channels, kernel, stride, pad) {}

absl::StatusOr<Shape> Conv2d::OutputShape(const Shape& input) const {
  return conv_.OutputShape(input);
}

void Conv2d::Declare(const std::string& prefix, TensorDecls* decls) {
  conv_.Declare(prefix, decls);
}

absl::StatusOr<Tensor> Conv2d::Forward(const Tensor& x, Mode mode) {
  PS_RETURN_IF_ERROR(CheckDevice(Describe(), x, device()));
  PS_ASSIGN_OR_RETURN(Shape out_shape, OutputShape(x.shape()));
  PS_ASSIGN_OR_RETURN(Tensor y, y_.Get(device(), out_shape));
  PS_RETURN_IF_ERROR(kernels::Conv2dForward(*device(), conv_.ShapeFor(x.shape()), x.data<float>(),
                                            conv_.weight(), conv_.bias(), MutableF32(y)));
  x_ = x;
  return y;
}

absl::StatusOr<Tensor> Conv2d::Backward(const Tensor& dy, bool need_dx) {
  if (x_.empty()) return NoForward(Describe());
  PS_ASSIGN_OR_RETURN(Shape out_shape, OutputShape(x_.shape()));
  PS_ASSIGN_OR_RETURN(Tensor dx,
                      BeginBackward(Describe(), x_, dy, out_shape, need_dx, dx_, device()));
  PS_RETURN_IF_ERROR(kernels::Conv2dBackward(
      *device(), conv_.ShapeFor(x_.shape()), x_.data<float>(), conv_.weight(), dy.data<float>(),
      need_dx ? MutableF32(dx) : nullptr, conv_.mutable_weight_grad(), conv_.mutable_bias_grad()));
  return dx;
}

// --- Conv2dActivationPool ---

Conv2dActivationPool::Conv2dActivationPool(Device* device, int64_t in_channels,
                                           int64_t out_channels, int64_t kernel, int64_t stride,
                                           int64_t pad, Activation::Kind activation,
                                           Pool2d::Kind pool, int64_t pool_kernel,
                                           int64_t pool_stride, int64_t pool_pad)
    : Layer(device),
      conv_(in_channels, out_channels, kernel, stride, pad),
      epilogue_{activation, {pool, pool_kernel, pool_stride, pool_pad}} {}

std::string Conv2dActivationPool::Describe() const {
  return absl::StrCat(conv_.Describe(), "+", epilogue_.Describe());
}

absl::StatusOr<Shape> Conv2dActivationPool::OutputShape(const Shape& input) const {
  absl::StatusOr<Shape> conv = conv_.OutputShape(input);
  if (!conv.ok()) return BadInput(Describe(), input, conv.status().message());
  absl::StatusOr<Shape> pooled = epilogue_.OutputShape(*conv);
  if (!pooled.ok()) return BadInput(Describe(), input, pooled.status().message());
  return pooled;
}

void Conv2dActivationPool::Declare(const std::string& prefix, TensorDecls* decls) {
  conv_.Declare(prefix, decls);
}

kernels::ConvActivationPool Conv2dActivationPool::EpilogueFor(const Shape& conv_output) const {
  kernels::ConvActivationPool e;
  e.activation = epilogue_.kernel_activation();
  e.max = epilogue_.window.kind == Pool2d::Kind::kMax;
  e.pool = epilogue_.window.ShapeFor(conv_output);
  return e;
}

absl::StatusOr<Tensor> Conv2dActivationPool::Forward(const Tensor& x, Mode mode) {
  PS_RETURN_IF_ERROR(CheckDevice(Describe(), x, device()));
  PS_ASSIGN_OR_RETURN(Shape out_shape, OutputShape(x.shape()));
  PS_ASSIGN_OR_RETURN(Shape conv_shape, conv_.OutputShape(x.shape()));
  PS_ASSIGN_OR_RETURN(Tensor a, a_.Get(device(), conv_shape));
  PS_ASSIGN_OR_RETURN(Tensor y, y_.Get(device(), out_shape));
  const kernels::ConvActivationPool e = EpilogueFor(conv_shape);
  int32_t* argmax = nullptr;
  if (e.max) {
    PS_ASSIGN_OR_RETURN(Tensor t, argmax_.Get(device(), out_shape, DType::kI32));
    argmax = MutableI32(t);
  }
  PS_RETURN_IF_ERROR(kernels::Conv2dActivationPoolForward(
      *device(), conv_.ShapeFor(x.shape()), e, x.data<float>(), conv_.weight(), conv_.bias(),
      MutableF32(a), MutableF32(y), argmax));
  x_ = x;
  a_view_ = a;
  return y;
}

absl::StatusOr<Tensor> Conv2dActivationPool::Backward(const Tensor& dy, bool need_dx) {
  if (x_.empty()) return NoForward(Describe());
  PS_ASSIGN_OR_RETURN(Shape out_shape, OutputShape(x_.shape()));
  PS_ASSIGN_OR_RETURN(Tensor dx,
                      BeginBackward(Describe(), x_, dy, out_shape, need_dx, dx_, device()));
  const kernels::ConvActivationPool e = EpilogueFor(a_view_.shape());
  const int32_t* argmax = nullptr;
  if (e.max) {
    PS_ASSIGN_OR_RETURN(Tensor t, argmax_.Get(device(), out_shape, DType::kI32));
    argmax = t.data<int32_t>();
  }
  PS_RETURN_IF_ERROR(kernels::Conv2dActivationPoolBackward(
      *device(), conv_.ShapeFor(x_.shape()), e, x_.data<float>(), conv_.weight(),
      a_view_.data<float>(), dy.data<float>(), argmax, need_dx ? MutableF32(dx) : nullptr,
      conv_.mutable_weight_grad(), conv_.mutable_bias_grad()));
  return dx;
}

}  // namespace ps::worker::model
