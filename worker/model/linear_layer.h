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
// `block_rows` > 0: see Blocked.
class Linear final : public Layer {
 public:
  Linear(Device* device, int64_t in_features, int64_t out_features, int64_t block_rows = 0);
  std::string Describe() const override;
  absl::StatusOr<Shape> OutputShape(const Shape& input) const override;
  void Declare(const std::string& prefix, TensorDecls* decls) override;
  absl::StatusOr<Tensor> Forward(const Tensor& x, Mode mode) override;
  absl::StatusOr<Tensor> Backward(const Tensor& dy, bool need_dx) override;
  bool AwaitsParametersInParts() const override { return Blocked(); }

 private:
  // With block_rows_ > 0, on a CPU device, a layer of at least two blocks
  // of block_rows_ output features computes its forward pass and its weight
  // gradient block by block (the same blocks whether or not anyone listens,
  // so the values never depend on it), both from the last block: each
  // forward block waits only for its own rows of the weight, and the weight
  // gradient is handed over block by block, so on a slow link the first pushes
  // leave, and the next forward starts, a fraction of the layer's compute
  // earlier (MLP-20M's 4096 x 4096 fc2). A block's GEMM runs a few per
  // cent slower than the whole layer's, hence off by default.
  bool Blocked() const;
  int64_t LastBlockRow() const;  // the first row of the last block
  absl::StatusOr<Tensor> BackwardBlocked(const Tensor& dy, bool need_dx);

  const int64_t in_features_, out_features_, block_rows_;
  Tensor weight_, weight_grad_, bias_, bias_grad_;
  Tensor x_;
  ActivationBuffer y_, dx_;
};

}  // namespace ps::worker::model

#endif  // PS_WORKER_MODEL_LINEAR_LAYER_H_
