#ifndef PS_WORKER_MODEL_POOL_LAYER_H_
#define PS_WORKER_MODEL_POOL_LAYER_H_

// Pooling over [N, C, H, W]: max and average windows, the global average,
// and an activation fused with the pooling that follows it.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/device.h"
#include "common/tensor.h"
#include "kernels/activation_pool.h"
#include "kernels/pool.h"
#include "worker/model/activation_layer.h"
#include "worker/model/layer.h"

namespace ps::worker::model {

// torch.nn.MaxPool2d / AvgPool2d (count_include_pad=True) with square kernel,
// stride and padding, over [N, C, H, W].
class Pool2d final : public Layer {
 public:
  enum class Kind { kMax, kAverage };

  // The window and what it computes; the fused layers that pool
  // (ActivationPool2d, Conv2dActivationPool) describe and check their
  // pooling with it too.
  struct Window {
    Kind kind;
    int64_t kernel, stride, pad;

    // "MaxPool2d(kernel=2, stride=2, pad=0)".
    std::string Describe() const;
    kernels::Pool2dShape ShapeFor(const Shape& input) const;
    // The pooled shape of `input`; kInvalidArgument naming `layer` when the
    // window does not fit.
    absl::StatusOr<Shape> OutputShape(const std::string& layer, const Shape& input) const;
  };

  Pool2d(Device* device, Kind kind, int64_t kernel, int64_t stride, int64_t pad = 0);
  std::string Describe() const override { return window_.Describe(); }
  absl::StatusOr<Shape> OutputShape(const Shape& input) const override;
  absl::StatusOr<Tensor> Forward(const Tensor& x, Mode mode) override;
  absl::StatusOr<Tensor> Backward(const Tensor& dy, bool need_dx) override;

 private:
  const Window window_;
  Shape x_shape_;
  ActivationBuffer y_, dx_;
  ActivationBuffer argmax_;  // I32 (max only)
};

// torch.nn.AdaptiveAvgPool2d((1, 1)): [N, C, H, W] -> [N, C, 1, 1].
class GlobalAvgPool2d final : public Layer {
 public:
  explicit GlobalAvgPool2d(Device* device);
  std::string Describe() const override { return "GlobalAvgPool2d"; }
  absl::StatusOr<Shape> OutputShape(const Shape& input) const override;
  absl::StatusOr<Tensor> Forward(const Tensor& x, Mode mode) override;
  absl::StatusOr<Tensor> Backward(const Tensor& dy, bool need_dx) override;

 private:
  kernels::Pool2dShape ShapeFor(const Shape& input) const;

  Shape x_shape_;
  ActivationBuffer y_, dx_;
};

namespace internal {

// An activation followed by a pooling window, as the fused layers
// (ActivationPool2d, Conv2dActivationPool) compute them.
struct ActivationThenPool {
  Activation::Kind activation;
  Pool2d::Window window;

  // "ReLU+MaxPool2d(kernel=2, stride=2, pad=0)".
  std::string Describe() const;
  // The pooled shape; kInvalidArgument naming Describe() otherwise.
  absl::StatusOr<Shape> OutputShape(const Shape& input) const;
  kernels::PoolActivation kernel_activation() const;
};

}  // namespace internal

// An Activation followed by a Pool2d over [N, C, H, W], as one layer with the
// same results (bit-identical on the CPU): forward activates each plane and
// pools it while it is in cache, keeping the activation for backward;
// backward spreads the pooled gradient and applies the activation's
// derivative in one pass, saving the separate pool passes and a full-size
// intermediate gradient. Declares no tensors, so a model's parameter names
// are those of the unfused sequence. (Where a Conv2d comes first, as in
// LeNet, Conv2dActivationPool in conv_layer.h fuses all three.)
class ActivationPool2d final : public Layer {
 public:
  ActivationPool2d(Device* device, Activation::Kind activation, Pool2d::Kind pool, int64_t kernel,
                   int64_t stride, int64_t pad = 0);
  std::string Describe() const override { return spec_.Describe(); }
  absl::StatusOr<Shape> OutputShape(const Shape& input) const override;
  absl::StatusOr<Tensor> Forward(const Tensor& x, Mode mode) override;
  absl::StatusOr<Tensor> Backward(const Tensor& dy, bool need_dx) override;

 private:
  const internal::ActivationThenPool spec_;
  Shape x_shape_;
  Tensor a_view_;  // the last forward's activation, which backward reads
  ActivationBuffer a_, y_, dx_;
  ActivationBuffer argmax_;  // I32 (max only)
};

}  // namespace ps::worker::model

#endif  // PS_WORKER_MODEL_POOL_LAYER_H_
