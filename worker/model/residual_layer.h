#ifndef PS_WORKER_MODEL_RESIDUAL_LAYER_H_
#define PS_WORKER_MODEL_RESIDUAL_LAYER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/device.h"
#include "common/tensor.h"
#include "worker/model/activation_layer.h"
#include "worker/model/batch_norm_layer.h"
#include "worker/model/conv_layer.h"
#include "worker/model/layer.h"

namespace ps::worker::model {

// Dive into Deep Learning's Residual (section 8.6) over [N, C, H, W]:
//   y = relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))
// conv1 3x3 pad 1 with `stride`, conv2 3x3 pad 1; shortcut = conv3 (1x1 with
// `stride`) when use_1x1conv, else the identity (which needs in == out
// channels and stride 1). Children: conv1, bn1, conv2, bn2[, conv3].
class Residual final : public Layer {
 public:
  Residual(Device* device, int64_t in_channels, int64_t out_channels, bool use_1x1conv,
           int64_t stride);
  std::string Describe() const override;
  absl::StatusOr<Shape> OutputShape(const Shape& input) const override;
  void Declare(const std::string& prefix, TensorDecls* decls) override;
  absl::StatusOr<Tensor> Forward(const Tensor& x, Mode mode) override;
  absl::StatusOr<Tensor> Backward(const Tensor& dy, bool need_dx) override;

 private:
  const int64_t in_channels_, out_channels_, stride_;
  Conv2d conv1_;
  BatchNorm bn1_;
  Activation relu1_;
  Conv2d conv2_;
  BatchNorm bn2_;
  std::unique_ptr<Conv2d> conv3_;  // null: identity shortcut
  Activation relu2_;
  ActivationBuffer sum_, dx_;
};

}  // namespace ps::worker::model

#endif  // PS_WORKER_MODEL_RESIDUAL_LAYER_H_
