#ifndef PS_WORKER_MODEL_LAYER_H_
#define PS_WORKER_MODEL_LAYER_H_

// The Layer interface models are built from, and what every layer shares:
// the declarations of its tensors and its reusable activation buffers. The
// layers themselves live one family per file (conv_layer.h, linear_layer.h,
// pool_layer.h, activation_layer.h, batch_norm_layer.h, flatten_layer.h,
// residual_layer.h, sequential.h); parameter_set.h holds their parameters.
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
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/device.h"
#include "common/dtype.h"
#include "common/param_spec.h"
#include "common/tensor.h"

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

  // Called by a layer inside Backward as soon as its parameter gradients
  // from element `from` of its own parameters (in declaration order) to
  // their end are final, before it computes dx (Linear does, block by block
  // from its last: their communication can start while the rest is
  // computed; the layer still reads its parameters until Backward returns);
  // a layer that does not call it has them final when Backward returns.
  // Null (the default): nothing. Set by the sequence around one Backward;
  // must outlive it.
  void set_gradients_ready(const std::function<void(int64_t from)>* ready) {
    gradients_ready_ = ready;
  }

  // A layer that reads its parameters in parts during Forward (a large
  // Linear, block by block of output features) says so here, and then calls
  // the function set below before it reads elements [from, to) of its own
  // parameters; it may block until they are the ones the pass must use.
  // Other layers' parameters are awaited whole before their Forward.
  virtual bool AwaitsParametersInParts() const { return false; }
  void set_parameters_needed(const std::function<absl::Status(int64_t from, int64_t to)>* needed) {
    parameters_needed_ = needed;
  }

 protected:
  explicit Layer(Device* device) : device_(device) {}
  Device* device() const { return device_; }
  // The notice above, if one is set.
  void GradientsReady(int64_t from) const {
    if (gradients_ready_ != nullptr) (*gradients_ready_)(from);
  }
  bool wants_gradients_ready() const { return gradients_ready_ != nullptr; }
  absl::Status ParametersNeeded(int64_t from, int64_t to) const {
    return parameters_needed_ != nullptr ? (*parameters_needed_)(from, to) : absl::OkStatus();
  }

 private:
  Device* device_;
  const std::function<void(int64_t)>* gradients_ready_ = nullptr;
  const std::function<absl::Status(int64_t, int64_t)>* parameters_needed_ = nullptr;
};

// For the layers' implementations: errors that name the layer, checks of the
// tensors a layer is handed, and the declaration of its tensors.
namespace internal {

// kInvalidArgument: "<layer> cannot take input <shape>: <why>".
absl::Status BadInput(const std::string& layer, const Shape& input, absl::string_view why);

// kFailedPrecondition: Backward before any Forward.
absl::Status NoForward(const std::string& layer);

// kInvalidArgument unless dy has the shape of the last forward's output.
absl::Status CheckGradShape(const std::string& layer, const Tensor& dy, const Shape& expected);

// The start of a Backward that every layer keeping its forward input `x`
// shares: a Forward ran (NoForward otherwise), dy has `dy_shape`
// (CheckGradShape), and with need_dx the layer's `dx` buffer shaped like x
// on `device` (an empty tensor without need_dx).
absl::StatusOr<Tensor> BeginBackward(const std::string& layer, const Tensor& x, const Tensor& dy,
                                     const Shape& dy_shape, bool need_dx, ActivationBuffer& dx,
                                     Device* device);

// kInvalidArgument unless `x` is an F32 tensor on `device`.
absl::Status CheckDevice(const std::string& layer, const Tensor& x, Device* device);

// Appends an F32 trainable parameter (value and gradient) to `decls`.
void AddParameter(TensorDecls* decls, std::string name, Shape shape, InitKind init, int64_t fan_in,
                  int64_t fan_out, Tensor* value, Tensor* grad);

// Appends an F32 non-trainable buffer to `decls`.
void AddBuffer(TensorDecls* decls, std::string name, Shape shape, InitKind init, Tensor* value);

}  // namespace internal
}  // namespace ps::worker::model

#endif  // PS_WORKER_MODEL_LAYER_H_
