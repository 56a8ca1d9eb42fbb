#ifndef PS_WORKER_MODEL_SEQUENTIAL_H_
#define PS_WORKER_MODEL_SEQUENTIAL_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/device.h"
#include "common/tensor.h"
#include "worker/model/layer.h"

namespace ps::worker::model {

// Named children applied in order. A child named "conv1" declares its
// tensors as "<prefix>conv1.weight"; a child with an empty name declares its
// own names under the sequence's prefix.
class Sequential final : public Layer {
 public:
  explicit Sequential(Device* device) : Layer(device) {}
  // Returns `layer` for further wiring; ownership passes to the sequence.
  Layer* Add(std::string name, std::unique_ptr<Layer> layer);

  std::string Describe() const override { return "Sequential"; }
  absl::StatusOr<Shape> OutputShape(const Shape& input) const override;
  void Declare(const std::string& prefix, TensorDecls* decls) override;
  absl::StatusOr<Tensor> Forward(const Tensor& x, Mode mode) override;
  absl::StatusOr<Tensor> Backward(const Tensor& dy, bool need_dx) override;

 private:
  std::vector<std::pair<std::string, std::unique_ptr<Layer>>> layers_;
};

}  // namespace ps::worker::model

#endif  // PS_WORKER_MODEL_SEQUENTIAL_H_
