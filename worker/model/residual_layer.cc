#include "worker/model/residual_layer.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/elementwise.h"

namespace ps::worker::model {

using internal::BadInput;
using internal::CheckDevice;

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

}  // namespace ps::worker::model
