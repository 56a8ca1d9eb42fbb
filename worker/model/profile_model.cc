#include "worker/model/profile_model.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/model/layer.h"

namespace ps::worker::model {
namespace {

// One profile layer: its range of the flat buffers and its times in ns per
// sample (the profile's ms per batch_size samples).
struct ReplayLayer {
  std::string name;
  int64_t begin = 0, end = 0;
  double forward_ns_per_sample = 0, backward_ns_per_sample = 0;
};

// The profile's tensors as F32 specs and its layers as ascending ranges;
// kInvalidArgument for what the replay cannot take (profile_model.h).
absl::Status Plan(const ModelProfile& profile, std::vector<ParamSpec>* specs,
                  std::vector<ReplayLayer>* layers) {
  absl::flat_hash_map<std::string, size_t> index;
  std::vector<int64_t> offsets = {0};
  for (size_t i = 0; i < profile.tensors.size(); ++i) {
    const ModelProfile::TensorEntry& t = profile.tensors[i];
    if (t.dtype != "float32") {
      return absl::InvalidArgumentError(absl::StrCat(
          "model profile ", profile.model, ": tensors[", i, "] '", t.name, "' is ", t.dtype,
          "; the worker replays float32 tensors only (its wire and buffers are F32)"));
    }
    specs->push_back(ParamSpec{t.name, t.shape, DType::kF32});
    index[t.name] = i;
    offsets.push_back(offsets.back() + NumElements(t.shape));
  }
  size_t next = 0;  // the first tensor the next layer must start at
  for (size_t l = 0; l < profile.layers.size(); ++l) {
    const ModelProfile::Layer& layer = profile.layers[l];
    for (size_t j = 0; j < layer.tensors.size(); ++j) {
      if (index.at(layer.tensors[j]) != next + j) {
        return absl::InvalidArgumentError(absl::StrCat(
            "model profile ", profile.model, ": layers[", l, "] '", layer.name,
            "': its tensors must be the next ones in the tensors' order (tensors[", next + j,
            "] onwards), since a replayed layer's parameters are one range after the "
            "previous layer's; '",
            layer.tensors[j], "' is tensors[", index.at(layer.tensors[j]), "]"));
      }
    }
    const double per_sample = 1e6 / static_cast<double>(profile.batch_size);
    layers->push_back(ReplayLayer{layer.name, offsets[next], offsets[next + layer.tensors.size()],
                                  layer.forward_ms * per_sample, layer.backward_ms * per_sample});
    next += layer.tensors.size();
  }
  return absl::OkStatus();
}

class ProfileModel final : public Model {
 public:
  ProfileModel(ModelConfig config, Device* device, std::vector<ParamSpec> specs,
               std::vector<ReplayLayer> layers, Tensor params, Tensor grads, Tensor buffers,
               Tensor metrics)
      : Model(std::move(config), device),
        specs_(std::move(specs)),
        layers_(std::move(layers)),
        params_(std::move(params)),
        grads_(std::move(grads)),
        buffers_(std::move(buffers)),
        metrics_(std::move(metrics)) {
    sleep_clock_ =
        this->config().profile_clock != nullptr ? this->config().profile_clock : Clock::Real();
  }

  const std::vector<ParamSpec>& parameters() const override { return specs_; }
  const std::vector<ParamSpec>& buffers() const override { return no_buffers_; }
  Tensor& flat_parameters() override { return params_; }
  Tensor& flat_gradients() override { return grads_; }
  Tensor& flat_buffers() override { return buffers_; }
  absl::StatusOr<Tensor> Find(const std::string& name) override {
    int64_t offset = 0;
    for (const ParamSpec& spec : specs_) {
      if (spec.name == name) return params_.View(offset, spec.shape);
      offset += NumElements(spec.shape);
    }
    return absl::NotFoundError(
        absl::StrCat("model profile ", config().profile->model, " has no tensor ", name));
  }
  absl::Status Initialize(uint64_t seed) override { return params_.SetZero(); }
  void set_observer(EventObserver* observer, const Clock* clock, int32_t lane) override {
    observer_ = observer;
    event_clock_ = clock;
    lane_ = lane;
  }
  void set_step(int64_t step) override { step_ = step; }
  void set_parameter_hooks(ParameterHooks* hooks) override { hooks_ = hooks; }
  std::vector<int64_t> LayerParameterBegins() const override {
    std::vector<int64_t> begins;
    for (const ReplayLayer& layer : layers_) begins.push_back(layer.begin);
    return begins;
  }

  absl::StatusOr<DeviceMetrics> ForwardBackward(const Tensor& inputs,
                                                const Tensor& labels) override;

  absl::StatusOr<DeviceMetrics> Evaluate(const Tensor& inputs, const Tensor& labels) override {
    float* metrics = MutableF32(metrics_);
    metrics[2] = metrics[3] = 0;
    return DeviceMetrics{&metrics[2], &metrics[3]};
  }

 private:
  void Report(EventKind kind, const ReplayLayer& layer, int64_t start_ns) const {
    if (observer_ == nullptr) return;
    TimedEvent event;
    event.kind = kind;
    event.lane = lane_;
    event.step = step_;
    event.name = layer.name;
    event.start_ns = start_ns;
    event.end_ns = event_clock_->NowNanos();
    observer_->OnEvent(event);
  }
  void WriteGradients(const ReplayLayer& layer, float per_element_scale);

  const std::vector<ParamSpec> specs_;
  const std::vector<ParamSpec> no_buffers_;
  const std::vector<ReplayLayer> layers_;
  Tensor params_, grads_, buffers_;
  Tensor metrics_;  // [4]: training loss_sum, correct; evaluation loss_sum, correct
  const Clock* sleep_clock_ = nullptr;
  EventObserver* observer_ = nullptr;
  const Clock* event_clock_ = nullptr;
  int32_t lane_ = kTrainerLane;
  int64_t step_ = -1;
  ParameterHooks* hooks_ = nullptr;
};

void ProfileModel::WriteGradients(const ReplayLayer& layer, float scale) {
  // The pattern has period 7: compute its first period, then copy what is
  // written onto what follows, doubling, so a large layer is written at
  // memcpy speed rather than a division per element (the write must fit in
  // the layer's replayed backward time, VGG-16's 400 MB fc6 included).
  float* g = MutableF32(grads_) + layer.begin;
  const int64_t length = layer.end - layer.begin;
  int64_t done = std::min<int64_t>(length, 7);
  for (int64_t i = 0; i < done; ++i) {
    g[i] = scale * static_cast<float>((layer.begin + i) % 7 - 3);
  }
  while (done < length) {  // `done` is a multiple of 7 until the last copy
    const int64_t n = std::min(done, length - done);
    std::memcpy(g + done, g, static_cast<size_t>(n) * sizeof(float));
    done += n;
  }
}

absl::StatusOr<DeviceMetrics> ProfileModel::ForwardBackward(const Tensor& inputs,
                                                            const Tensor& labels) {
  // The samples of the pass: the staged batch's, or the labels' where a
  // compute mode staged no inputs.
  const int64_t n = !inputs.empty() ? inputs.dim(0) : labels.num_elements();
  if (n < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("model profile ", config().profile->model, ": a pass needs samples"));
  }
  const Clock* clock = sleep_clock_;
  const Clock* events = event_clock_ != nullptr ? event_clock_ : clock;
  // Deadlines on the clock: each layer's time runs from the later of the
  // previous deadline and the end of its wait for parameters.
  double deadline_ns = static_cast<double>(clock->NowNanos());
  for (const ReplayLayer& layer : layers_) {
    if (hooks_ != nullptr) {
      PS_RETURN_IF_ERROR(hooks_->BeforeForward(layer.begin, layer.end));
      deadline_ns = std::max(deadline_ns, static_cast<double>(clock->NowNanos()));
    }
    const int64_t start = events->NowNanos();
    deadline_ns += layer.forward_ns_per_sample * static_cast<double>(n);
    clock->SleepUntil(static_cast<int64_t>(deadline_ns));
    Report(EventKind::kForward, layer, start);
  }
  const float scale = static_cast<float>(n) * loss_scale() * 1e-3f;
  for (auto it = layers_.rbegin(); it != layers_.rend(); ++it) {
    const int64_t start = events->NowNanos();
    deadline_ns += it->backward_ns_per_sample * static_cast<double>(n);
    WriteGradients(*it, scale);
    clock->SleepUntil(static_cast<int64_t>(deadline_ns));
    Report(EventKind::kBackward, *it, start);
    if (hooks_ != nullptr) hooks_->AfterBackward(it->begin, it->end);
  }
  float* metrics = MutableF32(metrics_);
  metrics[0] = metrics[1] = 0;
  return DeviceMetrics{&metrics[0], &metrics[1]};
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> CreateProfileModel(const ModelConfig& config,
                                                          Device* device) {
  if (device == nullptr) return absl::InvalidArgumentError("CreateProfileModel: null device");
  if (config.profile == nullptr) {
    return absl::InvalidArgumentError("model profile: no profile given (--model_profile)");
  }
  if (!device->is_host_memory()) {
    return absl::UnimplementedError(absl::StrCat(
        "model profile ", config.profile->model, " on ", device->name(),
        ": replayed models run on CPU devices only (the host writes their gradients)"));
  }
  std::vector<ParamSpec> specs;
  std::vector<ReplayLayer> layers;
  PS_RETURN_IF_ERROR(Plan(*config.profile, &specs, &layers));
  const int64_t total = TotalElements(specs);
  PS_ASSIGN_OR_RETURN(Tensor params, Tensor::Zeros(device, {total}));
  PS_ASSIGN_OR_RETURN(Tensor grads, Tensor::Zeros(device, {total}));
  PS_ASSIGN_OR_RETURN(Tensor buffers, Tensor::Empty(device, {0}));
  PS_ASSIGN_OR_RETURN(Tensor metrics, Tensor::Zeros(device, {4}));
  return std::unique_ptr<Model>(
      new ProfileModel(config, device, std::move(specs), std::move(layers), std::move(params),
                       std::move(grads), std::move(buffers), std::move(metrics)));
}

}  // namespace ps::worker::model
