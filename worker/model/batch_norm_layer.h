#ifndef PS_WORKER_MODEL_BATCH_NORM_LAYER_H_
#define PS_WORKER_MODEL_BATCH_NORM_LAYER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/device.h"
#include "common/tensor.h"
#include "kernels/batch_norm.h"
#include "worker/model/layer.h"

namespace ps::worker::model {

// torch.nn.BatchNorm1d over [N, C] (spatial_dims 0) or BatchNorm2d over
// [N, C, H, W] (spatial_dims 2); eps 1e-5, momentum 0.1. Parameters "weight"
// (gamma) and "bias" (beta) [C]; buffers "running_mean", "running_var" [C]
// and "num_batches_tracked" [] (a scalar, F32 here, int64 in PyTorch),
// incremented by each training forward.
class BatchNorm final : public Layer {
 public:
  static constexpr float kEps = 1e-5f;
  static constexpr float kMomentum = 0.1f;

  BatchNorm(Device* device, int64_t channels, int spatial_dims);
  std::string Describe() const override;
  absl::StatusOr<Shape> OutputShape(const Shape& input) const override;
  void Declare(const std::string& prefix, TensorDecls* decls) override;
  absl::StatusOr<Tensor> Forward(const Tensor& x, Mode mode) override;
  absl::StatusOr<Tensor> Backward(const Tensor& dy, bool need_dx) override;

 private:
  kernels::BatchNormShape ShapeFor(const Shape& input) const;

  const int64_t channels_;
  const int spatial_dims_;
  Tensor gamma_, gamma_grad_, beta_, beta_grad_;
  Tensor running_mean_, running_var_, num_batches_tracked_;
  Tensor save_mean_, save_inv_std_;  // [C], from the last training forward
  Tensor one_;                       // [1] = 1, to count batches on device
  bool have_batch_stats_ = false;
  Tensor x_;
  ActivationBuffer y_, dx_;
};

}  // namespace ps::worker::model

#endif  // PS_WORKER_MODEL_BATCH_NORM_LAYER_H_
