#ifndef PS_WORKER_MODEL_ACTIVATION_LAYER_H_
#define PS_WORKER_MODEL_ACTIVATION_LAYER_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/device.h"
#include "common/tensor.h"
#include "worker/model/layer.h"

namespace ps::worker::model {

// Element-wise ReLU or sigmoid, any shape. (Followed by pooling, see
// ActivationPool2d in pool_layer.h, which fuses the two.)
class Activation final : public Layer {
 public:
  enum class Kind { kRelu, kSigmoid };
  // "ReLU" or "Sigmoid", as Describe() and the fused layers name it.
  static std::string Name(Kind kind);

  Activation(Device* device, Kind kind);
  std::string Describe() const override { return Name(kind_); }
  absl::StatusOr<Shape> OutputShape(const Shape& input) const override;
  absl::StatusOr<Tensor> Forward(const Tensor& x, Mode mode) override;
  absl::StatusOr<Tensor> Backward(const Tensor& dy, bool need_dx) override;

 private:
  const Kind kind_;
  Tensor y_view_;  // the last output, which backward reads
  ActivationBuffer y_, dx_;
};

}  // namespace ps::worker::model

#endif  // PS_WORKER_MODEL_ACTIVATION_LAYER_H_
