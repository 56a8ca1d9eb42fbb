#ifndef PS_WORKER_MODEL_FLATTEN_LAYER_H_
#define PS_WORKER_MODEL_FLATTEN_LAYER_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/device.h"
#include "common/tensor.h"
#include "worker/model/layer.h"

namespace ps::worker::model {

// torch.nn.Flatten: [N, d1, d2, ...] -> [N, d1 * d2 * ...]. No copies: the
// output is a reshaped handle on the input, dx one on dy.
class Flatten final : public Layer {
 public:
  explicit Flatten(Device* device) : Layer(device) {}
  std::string Describe() const override { return "Flatten"; }
  absl::StatusOr<Shape> OutputShape(const Shape& input) const override;
  absl::StatusOr<Tensor> Forward(const Tensor& x, Mode mode) override;
  absl::StatusOr<Tensor> Backward(const Tensor& dy, bool need_dx) override;

 private:
  Shape x_shape_;
};

}  // namespace ps::worker::model

#endif  // PS_WORKER_MODEL_FLATTEN_LAYER_H_
