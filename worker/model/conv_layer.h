#ifndef PS_WORKER_MODEL_CONV_LAYER_H_
#define PS_WORKER_MODEL_CONV_LAYER_H_

// Convolutions over [N, C, H, W]: the plain Conv2d, and the Conv2d that is
// followed by an activation and a pooling window fused into one layer.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/device.h"
#include "common/tensor.h"
#include "kernels/conv.h"
#include "worker/model/activation_layer.h"
#include "worker/model/layer.h"
#include "worker/model/pool_layer.h"

namespace ps::worker::model {
namespace internal {

// A square convolution's shape arithmetic and its parameters, "weight"
// [out, in, k, k] (Xavier-uniform) and "bias" [out] (zeros), with their
// gradients: what Conv2d and the fused Conv2dActivationPool share. The
// tensors are bound by ParameterSet through Declare.
class ConvParameters {
 public:
  ConvParameters(int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t stride,
                 int64_t pad);

  // "Conv2d(1, 6, kernel=5, stride=1, pad=2)".
  std::string Describe() const;
  kernels::Conv2dShape ShapeFor(const Shape& input) const;
  // The convolution's output shape; kInvalidArgument naming Describe().
  absl::StatusOr<Shape> OutputShape(const Shape& input) const;
  void Declare(const std::string& prefix, TensorDecls* decls);

  const float* weight() const { return weight_.data<float>(); }
  const float* bias() const { return bias_.data<float>(); }
  float* mutable_weight_grad() { return MutableF32(weight_grad_); }
  float* mutable_bias_grad() { return MutableF32(bias_grad_); }

 private:
  const int64_t in_channels_, out_channels_, kernel_, stride_, pad_;
  Tensor weight_, weight_grad_, bias_, bias_grad_;
};

}  // namespace internal

// torch.nn.Conv2d with square kernel, stride and padding; "weight"
// [out, in, k, k] and "bias" [out].
class Conv2d final : public Layer {
 public:
  Conv2d(Device* device, int64_t in_channels, int64_t out_channels, int64_t kernel,
         int64_t stride = 1, int64_t pad = 0);
  std::string Describe() const override { return conv_.Describe(); }
  absl::StatusOr<Shape> OutputShape(const Shape& input) const override;
  void Declare(const std::string& prefix, TensorDecls* decls) override;
  absl::StatusOr<Tensor> Forward(const Tensor& x, Mode mode) override;
  absl::StatusOr<Tensor> Backward(const Tensor& dy, bool need_dx) override;

 private:
  internal::ConvParameters conv_;
  Tensor x_;
  ActivationBuffer y_, dx_;
};

// A Conv2d followed by an Activation and a Pool2d, fused (kernels/conv.h's
// Conv2dActivationPool*): the same parameters ("weight" [out, in, k, k] and
// "bias" [out], initialised as Conv2d's) and the same results as the three
// layers in sequence (bit-identical on the CPU), but the convolution's
// output is activated and pooled block by block while in cache, and its
// gradient is formed the same way in backward, so neither is ever stored.
class Conv2dActivationPool final : public Layer {
 public:
  Conv2dActivationPool(Device* device, int64_t in_channels, int64_t out_channels, int64_t kernel,
                       int64_t stride, int64_t pad, Activation::Kind activation,
                       Pool2d::Kind pool, int64_t pool_kernel, int64_t pool_stride,
                       int64_t pool_pad = 0);
  std::string Describe() const override;
  absl::StatusOr<Shape> OutputShape(const Shape& input) const override;
  void Declare(const std::string& prefix, TensorDecls* decls) override;
  absl::StatusOr<Tensor> Forward(const Tensor& x, Mode mode) override;
  absl::StatusOr<Tensor> Backward(const Tensor& dy, bool need_dx) override;

 private:
  kernels::ConvActivationPool EpilogueFor(const Shape& conv_output) const;

  internal::ConvParameters conv_;
  const internal::ActivationThenPool epilogue_;
  Tensor x_;
  Tensor a_view_;  // the last forward's activation, which backward reads
  ActivationBuffer a_, y_, dx_;
  ActivationBuffer argmax_;  // I32 (max only)
};

}  // namespace ps::worker::model

#endif  // PS_WORKER_MODEL_CONV_LAYER_H_
