#ifndef PS_WORKER_MODEL_LINEAR_LAYER_H_
#define PS_WORKER_MODEL_LINEAR_LAYER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/device.h"
#include "common/tensor.h"
#include "worker/model/layer.h"

namespace ps::worker::model {

// torch.nn.Linear: [N, in] -> [N, out]; "weight" [out, in], "bias" [out].
class Linear final : public Layer {
 public:
  Linear(Device* device, int64_t in_features, int64_t out_features);
  std::string Describe() const override;
  absl::StatusOr<Shape> OutputShape(const Shape& input) const override;
  void Declare(const std::string& prefix, TensorDecls* decls) override;
  absl::StatusOr<Tensor> Forward(const Tensor& x, Mode mode) override;
  absl::StatusOr<Tensor> Backward(const Tensor& dy, bool need_dx) override;
  bool AwaitsParametersInParts() const override { return Blocked(); }

  // Rows of a block of output features (see Blocked).
  static constexpr int64_t kBlockRows = 512;

 private:
  // On a CPU device a layer of at least two blocks of output features
  // computes its forward pass and its weight gradient block by block (the
  // same blocks whether or not anyone listens, so the values never depend
  // on it): each forward block waits only for its own rows of the weight,
  // and the weight gradient is handed over block by block from the last,
  // so on a slow link the first pushes leave, and the next forward starts,
  // a fraction of the layer's compute earlier (MLP-20M's 4096 x 4096 fc2).
  bool Blocked() const;
  absl::StatusOr<Tensor> BackwardBlocked(const Tensor& dy, bool need_dx);

  const int64_t in_features_, out_features_;
  Tensor weight_, weight_grad_, bias_, bias_grad_;
  Tensor x_;
  ActivationBuffer y_, dx_;
};

}  // namespace ps::worker::model

#endif  // PS_WORKER_MODEL_LINEAR_LAYER_H_
