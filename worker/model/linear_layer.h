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

 private:
  const int64_t in_features_, out_features_;
  Tensor weight_, weight_grad_, bias_, bias_grad_;
  Tensor x_;
  ActivationBuffer y_, dx_;
};

}  // namespace ps::worker::model

#endif  // PS_WORKER_MODEL_LINEAR_LAYER_H_
