#ifndef PS_WORKER_MODEL_MODEL_H_
#define PS_WORKER_MODEL_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/device.h"
#include "common/dtype.h"
#include "common/param_spec.h"
#include "common/tensor.h"
#include "common/timed_event.h"
#include "worker/model/model_profile.h"
#include "worker/model/parameter_hooks.h"

namespace ps::worker::model {

// The architecture a model is built from.
struct ModelConfig {
  // "softmax", "mlp", "lenet" (sigmoid + average pooling, Dive into Deep
  // Learning's), "lenet_relu" (ReLU + max pooling), "resnet18" (D2L's
  // ResNet-18 with batch norm, section 8.6: 7x7/2 stem and max pooling),
  // "resnet18_cifar" (D2L section 13.6's: 3x3/1 stem, no max pooling),
  // "profile" (`profile` replayed: profile_model.h; it ignores the input
  // shape and num_classes).
  std::string name = "lenet";
  Shape input_shape = {1, 28, 28};  // one sample: [C, H, W]
  int64_t num_classes = 10;
  std::vector<int64_t> mlp_hidden = {256};  // "mlp" only: hidden widths
  // "mlp" and "softmax": a Linear layer of at least twice this many output
  // features computes in blocks of this many on a CPU device (waiting for,
  // and handing over, its parameters block by block under overlap; see
  // Linear). 0: every layer whole.
  int64_t linear_block_rows = 0;
  // "profile" only: the profile replayed, shared read-only by the replicas,
  // and the clock its passes sleep on (null: Clock::Real()), which must
  // outlive the models.
  std::shared_ptr<const ModelProfile> profile;
  const Clock* profile_clock = nullptr;
};

// Loss and accuracy of a forward pass, in device memory (two floats) so the
// training loop need not synchronise with the device every step.
struct DeviceMetrics {
  const float* loss_sum = nullptr;  // sum over the samples of cross-entropy
  const float* correct = nullptr;   // number of samples predicted right
};

// A model replica on one device. Every trainable parameter is a view into one
// flat buffer (flat_parameters(), in parameters() order, each tensor
// contiguous, row-major), and every gradient a view into a second buffer of
// the same layout (flat_gradients()); buffers live in a third (flat_buffers()).
// So a whole model's parameters or gradients move between devices, host and
// wire in one copy, and the parameter server's keys are parameters()' names.
//
// Not thread-safe: one thread drives one replica. The device must outlive it.
class Model {
 public:
  // kInvalidArgument for an unknown model name or an input shape the
  // architecture cannot take (naming both).
  static absl::StatusOr<std::unique_ptr<Model>> Create(const ModelConfig& config, Device* device);
  virtual ~Model() = default;

  const ModelConfig& config() const;
  Device* device() const;

  // Trainable parameters, in a fixed order (the model's signature).
  virtual const std::vector<ParamSpec>& parameters() const = 0;
  // Non-trainable state saved with the weights (running_mean, running_var,
  // num_batches_tracked as F32). Empty for models without batch norm.
  virtual const std::vector<ParamSpec>& buffers() const = 0;

  virtual Tensor& flat_parameters() = 0;  // [total parameter elements]
  virtual Tensor& flat_gradients() = 0;   // same layout as flat_parameters()
  virtual Tensor& flat_buffers() = 0;     // [total buffer elements]
  // The view of one parameter or buffer by name; kNotFound otherwise.
  virtual absl::StatusOr<Tensor> Find(const std::string& name) = 0;

  // Seeded initialisation: conv and linear weights Xavier-uniform (as D2L's
  // init_cnn), biases 0, batch-norm gamma 1, beta 0, running mean 0, var 1.
  // Deterministic in `seed` on every device type.
  virtual absl::Status Initialize(uint64_t seed) = 0;

  // Training step on one shard: inputs [n, C, H, W] and labels int32 [n] on
  // this device (n >= 1, may change between calls). Runs forward in training
  // mode (batch norm uses the shard's statistics and updates running stats),
  // the summed softmax cross-entropy loss, and backward, overwriting
  // flat_gradients() with the gradient of the loss SUM over the shard.
  // Queued on the device; the metrics are valid once the device synchronises.
  virtual absl::StatusOr<DeviceMetrics> ForwardBackward(const Tensor& inputs,
                                                        const Tensor& labels) = 0;

  // Inference-mode forward (batch norm uses running statistics) and loss;
  // gradients untouched.
  virtual absl::StatusOr<DeviceMetrics> Evaluate(const Tensor& inputs, const Tensor& labels) = 0;

  // Reports the Forward and Backward pass of each of the replica's top-level
  // layers, in ForwardBackward and Evaluate, as kForward / kBackward events
  // on `lane` with the step last given to set_step (-1 before any), timed on
  // `clock`. An event is named after its layer ("conv1", "fc3", "stage2"; an
  // unnamed layer by its Describe(), e.g. "Flatten"); a nested sequence is
  // one event. Reported on the thread driving the replica. On CUDA devices
  // kernels run asynchronously and no synchronisation is added: an event
  // spans the host enqueueing the layer's work, not its execution on the
  // device. A null observer (the default) reports nothing and reads no clock.
  // `observer` and `clock` must outlive the model.
  virtual void set_observer(EventObserver* observer, const Clock* clock, int32_t lane) = 0;
  // The step the following passes' events belong to.
  virtual void set_step(int64_t step) = 0;

  // Calls `hooks` around the top-level layers of ForwardBackward (not
  // Evaluate, which needs every parameter before it starts), on the thread
  // driving the replica. Null (the default): none. Must outlive the model or
  // be reset to null.
  virtual void set_parameter_hooks(ParameterHooks* hooks) = 0;
  // Where the parameters of each top-level layer that has any begin in
  // flat_parameters(), ascending: the layers of the hooks' ranges.
  virtual std::vector<int64_t> LayerParameterBegins() const = 0;

  // Loss scaling (fp16 training): ForwardBackward's gradients are those of
  // the loss sum times `scale` (dlogits are multiplied by it, so every
  // gradient below is too). 1 until set.
  void set_loss_scale(float scale) { loss_scale_ = scale; }
  float loss_scale() const { return loss_scale_; }

 protected:
  Model(ModelConfig config, Device* device) : config_(std::move(config)), device_(device) {}

 private:
  ModelConfig config_;
  Device* device_;
  float loss_scale_ = 1.f;
};

inline const ModelConfig& Model::config() const { return config_; }
inline Device* Model::device() const { return device_; }

// Total elements of a list of specs.
int64_t TotalElements(const std::vector<ParamSpec>& specs);

}  // namespace ps::worker::model

#endif  // PS_WORKER_MODEL_MODEL_H_
