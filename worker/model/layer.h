#ifndef PS_WORKER_MODEL_LAYER_H_
#define PS_WORKER_MODEL_LAYER_H_

// The layers models are built from, and the flat storage of their parameters.
//
// A Layer maps a batch of activations [N, ...] to another; N may change from
// one call to the next. Each layer owns the buffers it writes (its output and
// its input gradient), allocated on first use and grown, never shrunk, when a
// larger N arrives, so a steady training loop allocates nothing per step.
//
// Parameters are not owned by layers: a layer declares them (PyTorch-relative
// names, shapes, how to initialise them) and ParameterSet binds them to views
// of one flat parameter buffer, one flat gradient buffer of the same layout and
// one flat buffer for non-trainable state, in declaration order.
//
// Work is queued on the layer's device (asynchronous on CUDA). Not
// thread-safe: one thread drives a layer tree.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/device.h"
#include "common/dtype.h"
#include "common/param_spec.h"
#include "common/tensor.h"
#include "kernels/batch_norm.h"
#include "kernels/conv.h"
#include "kernels/pool.h"
#include "worker/model/model.h"

namespace ps::worker::model {

enum class Mode { kTraining, kInference };

// Writable element pointers of a device tensor. (Tensor::mutable_data<T>()
// does not compile at this writing: it casts the const raw_data() pointer.)
inline float* MutableF32(Tensor& t) { return static_cast<float*>(t.mutable_raw_data()); }
inline int32_t* MutableI32(Tensor& t) { return static_cast<int32_t*>(t.mutable_raw_data()); }

// How Initialize fills a tensor.
enum class InitKind {
  kXavierUniform,  // U(-b, b), b = sqrt(6 / (fan_in + fan_out))
  kZeros,
  kOnes,
};

// One tensor a layer declares. `value` (and `grad`, for trainable parameters)
// point at the layer's members, which ParameterSet sets to views of the flat
// buffers; the layer must not move while bound.
struct TensorSlot {
  ParamSpec spec;  // full (prefixed) name
  InitKind init = InitKind::kZeros;
  int64_t fan_in = 0;  // kXavierUniform only
  int64_t fan_out = 0;
  Tensor* value = nullptr;
  Tensor* grad = nullptr;  // null for buffers
};

struct TensorDecls {
  std::vector<TensorSlot> parameters;
  std::vector<TensorSlot> buffers;
};

// A device tensor reused across calls: Get returns a view of `shape` on
// storage that is reallocated only when it is too small. Views handed out
// earlier stay valid (they keep the old storage alive) but are no longer
// written by this buffer once it has grown.
class ActivationBuffer {
 public:
  absl::StatusOr<Tensor> Get(Device* device, const Shape& shape, DType dtype = DType::kF32);
  int64_t capacity() const { return storage_.num_elements(); }

 private:
  Tensor storage_;
};

class Layer {
 public:
  virtual ~Layer() = default;
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  // "Conv2d(1, 6, kernel=5, stride=1, pad=2)": for error messages.
  virtual std::string Describe() const = 0;

  // The output shape for an input of `input` ([N, ...]); kInvalidArgument,
  // naming the layer and the shape, when the layer cannot take it.
  virtual absl::StatusOr<Shape> OutputShape(const Shape& input) const = 0;

  // Appends this layer's parameters and buffers, names prefixed by `prefix`
  // ("" or ending in '.'). Layers without state declare nothing.
  virtual void Declare(const std::string& prefix, TensorDecls* decls) {}

  // Computes the output for `x` (on this layer's device). The returned tensor
  // is owned by the layer (or is a view of `x`) and is valid until the next
  // Forward. `x` must stay unchanged until Backward has run, which reads it.
  // kInference uses batch norm's running statistics; kTraining updates them.
  virtual absl::StatusOr<Tensor> Forward(const Tensor& x, Mode mode) = 0;

  // Given dy (the gradient of the loss with respect to the last Forward's
  // output, same shape), overwrites this layer's parameter gradients and,
  // when `need_dx`, returns dx, the gradient with respect to that Forward's
  // input (owned by the layer, valid until the next Backward); otherwise an
  // empty tensor. Must follow a kTraining Forward (batch norm needs its batch
  // statistics); FailedPrecondition if no Forward ran. dy is not modified.
  virtual absl::StatusOr<Tensor> Backward(const Tensor& dy, bool need_dx) = 0;

 protected:
  explicit Layer(Device* device) : device_(device) {}
  Device* device() const { return device_; }

 private:
  Device* device_;
};

// --- concrete layers -------------------------------------------------------

// torch.nn.Conv2d with square kernel, stride and padding; "weight"
// [out, in, k, k] and "bias" [out].
class Conv2d final : public Layer {
 public:
  Conv2d(Device* device, int64_t in_channels, int64_t out_channels, int64_t kernel,
         int64_t stride = 1, int64_t pad = 0);
  std::string Describe() const override;
  absl::StatusOr<Shape> OutputShape(const Shape& input) const override;
  void Declare(const std::string& prefix, TensorDecls* decls) override;
  absl::StatusOr<Tensor> Forward(const Tensor& x, Mode mode) override;
  absl::StatusOr<Tensor> Backward(const Tensor& dy, bool need_dx) override;

 private:
  kernels::Conv2dShape ShapeFor(const Shape& input) const;

  const int64_t in_channels_, out_channels_, kernel_, stride_, pad_;
  Tensor weight_, weight_grad_, bias_, bias_grad_;
  Tensor x_;
  ActivationBuffer y_, dx_;
};

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

// torch.nn.MaxPool2d / AvgPool2d (count_include_pad=True) with square kernel,
// stride and padding, over [N, C, H, W].
class Pool2d final : public Layer {
 public:
  enum class Kind { kMax, kAverage };
  Pool2d(Device* device, Kind kind, int64_t kernel, int64_t stride, int64_t pad = 0);
  std::string Describe() const override;
  absl::StatusOr<Shape> OutputShape(const Shape& input) const override;
  absl::StatusOr<Tensor> Forward(const Tensor& x, Mode mode) override;
  absl::StatusOr<Tensor> Backward(const Tensor& dy, bool need_dx) override;

 private:
  kernels::Pool2dShape ShapeFor(const Shape& input) const;

  const Kind kind_;
  const int64_t kernel_, stride_, pad_;
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

// Element-wise ReLU or sigmoid, any shape.
class Activation final : public Layer {
 public:
  enum class Kind { kRelu, kSigmoid };
  Activation(Device* device, Kind kind);
  std::string Describe() const override;
  absl::StatusOr<Shape> OutputShape(const Shape& input) const override;
  absl::StatusOr<Tensor> Forward(const Tensor& x, Mode mode) override;
  absl::StatusOr<Tensor> Backward(const Tensor& dy, bool need_dx) override;

 private:
  const Kind kind_;
  Tensor y_view_;  // the last output, which backward reads
  ActivationBuffer y_, dx_;
};

// An Activation followed by a Pool2d over [N, C, H, W], as one layer with the
// same results (bit-identical on the CPU): forward activates each plane and
// pools it while it is in cache, keeping the activation for backward;
// backward spreads the pooled gradient and applies the activation's
// derivative in one pass, saving the separate pool passes and a full-size
// intermediate gradient. Declares no tensors, so a model's parameter names
// are those of the unfused sequence. (Where a Conv2d comes first, as in
// LeNet, Conv2dActivationPool below fuses all three.)
class ActivationPool2d final : public Layer {
 public:
  ActivationPool2d(Device* device, Activation::Kind activation, Pool2d::Kind pool, int64_t kernel,
                   int64_t stride, int64_t pad = 0);
  std::string Describe() const override;
  absl::StatusOr<Shape> OutputShape(const Shape& input) const override;
  absl::StatusOr<Tensor> Forward(const Tensor& x, Mode mode) override;
  absl::StatusOr<Tensor> Backward(const Tensor& dy, bool need_dx) override;

 private:
  const Activation::Kind activation_;
  const Pool2d::Kind pool_kind_;
  const int64_t kernel_, stride_, pad_;
  Shape x_shape_;
  Tensor a_view_;  // the last forward's activation, which backward reads
  ActivationBuffer a_, y_, dx_;
  ActivationBuffer argmax_;  // I32 (max only)
};

// A Conv2d followed by an Activation and a Pool2d, fused (conv.h's
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

  const int64_t in_channels_, out_channels_, kernel_, stride_, pad_;
  const Activation::Kind activation_;
  const Pool2d::Kind pool_kind_;
  const int64_t pool_kernel_, pool_stride_, pool_pad_;
  Conv2d conv_shapes_;                  // shape checks only; holds no parameters
  ActivationPool2d activation_shapes_;  // likewise
  Tensor weight_, weight_grad_, bias_, bias_grad_;
  Tensor x_;
  Tensor a_view_;  // the last forward's activation, which backward reads
  ActivationBuffer a_, y_, dx_;
  ActivationBuffer argmax_;  // I32 (max only)
};

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

// --- flat parameter storage ------------------------------------------------

// The flat parameter, gradient and buffer storage of one layer tree, bound to
// the layers' tensors. The layer tree must outlive the set and must not be
// bound to another set.
class ParameterSet {
 public:
  // Collects `root`'s declarations (names prefixed by nothing), allocates the
  // three flat buffers on `device` and binds every declared tensor to its
  // view. Gradients start at zero; parameters and buffers are uninitialised
  // until Initialize. kInvalidArgument for a duplicate name.
  static absl::StatusOr<std::unique_ptr<ParameterSet>> Create(Layer& root, Device* device);

  const std::vector<ParamSpec>& parameters() const { return parameter_specs_; }
  const std::vector<ParamSpec>& buffers() const { return buffer_specs_; }
  Tensor& flat_parameters() { return flat_parameters_; }
  Tensor& flat_gradients() { return flat_gradients_; }
  Tensor& flat_buffers() { return flat_buffers_; }
  // A parameter's or buffer's view; kNotFound naming it otherwise.
  absl::StatusOr<Tensor> Find(const std::string& name) const;
  // The gradient view of a parameter; kNotFound otherwise.
  absl::StatusOr<Tensor> FindGradient(const std::string& name) const;

  // Fills parameters and buffers as their declarations say, from a
  // SplitMix64 stream (common/rng.h) seeded by `seed` and consumed in
  // parameter order. The values are generated on the host, so they are
  // bit-identical on every device type; one host-to-device copy per flat
  // buffer.
  absl::Status Initialize(uint64_t seed);

 private:
  ParameterSet() = default;

  TensorDecls decls_;
  std::vector<ParamSpec> parameter_specs_, buffer_specs_;
  Tensor flat_parameters_, flat_gradients_, flat_buffers_;
  absl::flat_hash_map<std::string, Tensor> by_name_, gradient_by_name_;
};

}  // namespace ps::worker::model

#endif  // PS_WORKER_MODEL_LAYER_H_
