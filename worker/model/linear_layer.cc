#include "worker/model/linear_layer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/linear.h"

namespace ps::worker::model {

using internal::AddParameter;
using internal::BadInput;
using internal::BeginBackward;
using internal::CheckDevice;
using internal::NoForward;

Linear::Linear(Device* device, int64_t in_features, int64_t out_features, int64_t block_rows)
    : Layer(device),
      in_features_(in_features),
      out_features_(out_features),
      block_rows_(block_rows) {}

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

bool Linear::Blocked() const {
  return block_rows_ > 0 && device()->is_cpu() && out_features_ >= 2 * block_rows_;
}

int64_t Linear::LastBlockRow() const { return (out_features_ - 1) / block_rows_ * block_rows_; }

absl::StatusOr<Tensor> Linear::Forward(const Tensor& x, Mode mode) {
  PS_RETURN_IF_ERROR(CheckDevice(Describe(), x, device()));
  PS_ASSIGN_OR_RETURN(Shape out_shape, OutputShape(x.shape()));
  PS_ASSIGN_OR_RETURN(Tensor y, y_.Get(device(), out_shape));
  if (Blocked()) {
    // Each block of output features once its rows of the weight are here,
    // from the last block, the order in which backward hands them over and
    // the scheduler sends them (see PushPullScheduler); the bias is added
    // at the end.
    for (int64_t row = LastBlockRow(); row >= 0; row -= block_rows_) {
      const int64_t end = std::min(out_features_, row + block_rows_);
      PS_RETURN_IF_ERROR(ParametersNeeded(row * in_features_, end * in_features_));
      PS_RETURN_IF_ERROR(kernels::LinearForwardRows(*device(), x.dim(0), in_features_,
                                                    out_features_, x.data<float>(),
                                                    weight_.data<float>(), row, end,
                                                    MutableF32(y)));
    }
    const int64_t weight_elements = out_features_ * in_features_;
    PS_RETURN_IF_ERROR(ParametersNeeded(weight_elements, weight_elements + out_features_));
    PS_RETURN_IF_ERROR(kernels::LinearAddBias(*device(), x.dim(0), out_features_,
                                              bias_.data<float>(), MutableF32(y)));
    x_ = x;
    return y;
  }
  PS_RETURN_IF_ERROR(kernels::LinearForward(*device(), x.dim(0), in_features_, out_features_,
                                            x.data<float>(), weight_.data<float>(),
                                            bias_.data<float>(), MutableF32(y)));
  x_ = x;
  return y;
}

absl::StatusOr<Tensor> Linear::Backward(const Tensor& dy, bool need_dx) {
  if (x_.empty()) return NoForward(Describe());
  if (Blocked()) return BackwardBlocked(dy, need_dx);
  PS_ASSIGN_OR_RETURN(Tensor dx, BeginBackward(Describe(), x_, dy, {x_.dim(0), out_features_},
                                               need_dx, dx_, device()));
  if (need_dx && wants_gradients_ready()) {
    // The parameter gradients first, handed over, then dx: the same kernels
    // on the same slices as the one call below, so the same results.
    PS_RETURN_IF_ERROR(kernels::LinearBackward(*device(), x_.dim(0), in_features_, out_features_,
                                               x_.data<float>(), weight_.data<float>(),
                                               dy.data<float>(), /*dx=*/nullptr,
                                               MutableF32(weight_grad_), MutableF32(bias_grad_)));
    GradientsReady(0);
    PS_RETURN_IF_ERROR(kernels::LinearBackward(*device(), x_.dim(0), in_features_, out_features_,
                                               x_.data<float>(), weight_.data<float>(),
                                               dy.data<float>(), MutableF32(dx),
                                               /*dweight=*/nullptr, /*dbias=*/nullptr));
    return dx;
  }
  PS_RETURN_IF_ERROR(kernels::LinearBackward(*device(), x_.dim(0), in_features_, out_features_,
                                             x_.data<float>(), weight_.data<float>(),
                                             dy.data<float>(), need_dx ? MutableF32(dx) : nullptr,
                                             MutableF32(weight_grad_), MutableF32(bias_grad_)));
  return dx;
}

absl::StatusOr<Tensor> Linear::BackwardBlocked(const Tensor& dy, bool need_dx) {
  PS_ASSIGN_OR_RETURN(Tensor dx, BeginBackward(Describe(), x_, dy, {x_.dim(0), out_features_},
                                               need_dx, dx_, device()));
  const int64_t batch = x_.dim(0);
  // The bias gradient (last in the flat buffer), then the weight gradient's
  // blocks from the last, each handed over as it is done, then dx (which
  // still reads the weight).
  PS_RETURN_IF_ERROR(kernels::LinearBackward(*device(), batch, in_features_, out_features_,
                                             x_.data<float>(), weight_.data<float>(),
                                             dy.data<float>(), /*dx=*/nullptr,
                                             /*dweight=*/nullptr, MutableF32(bias_grad_)));
  GradientsReady(out_features_ * in_features_);
  for (int64_t row = LastBlockRow(); row >= 0; row -= block_rows_) {
    const int64_t end = std::min(out_features_, row + block_rows_);
    PS_RETURN_IF_ERROR(kernels::LinearWeightGradientRows(*device(), batch, in_features_,
                                                         out_features_, x_.data<float>(),
                                                         dy.data<float>(), row, end,
                                                         MutableF32(weight_grad_)));
    GradientsReady(row * in_features_);
  }
  if (need_dx) {
    PS_RETURN_IF_ERROR(kernels::LinearBackward(*device(), batch, in_features_, out_features_,
                                               x_.data<float>(), weight_.data<float>(),
                                               dy.data<float>(), MutableF32(dx),
                                               /*dweight=*/nullptr, /*dbias=*/nullptr));
  }
  return dx;
}

}  // namespace ps::worker::model
