#include "worker/model_profiler.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "common/timed_event.h"
#include "worker/model/parameter_hooks.h"

namespace ps::worker {
namespace {

// One pass's marks, in clock nanoseconds: each layer's first BeforeForward
// and last AfterBackward, and the first backward event's start.
class PassTimer final : public model::ParameterHooks, public EventObserver {
 public:
  PassTimer(const Clock* clock, std::vector<int64_t> begins)
      : clock_(clock), begins_(std::move(begins)) {}

  void Begin() {
    start_ns_ = clock_->NowNanos();
    first_forward_.assign(begins_.size(), -1);
    last_backward_.assign(begins_.size(), -1);
    backward_start_ns_ = -1;
  }
  absl::Status BeforeForward(int64_t begin, int64_t end) override {
    int64_t& mark = first_forward_[LayerOf(begin)];
    if (mark < 0) mark = clock_->NowNanos();
    return absl::OkStatus();
  }
  void AfterBackward(int64_t begin, int64_t end) override {
    last_backward_[LayerOf(begin)] = clock_->NowNanos();
  }
  void OnEvent(const TimedEvent& event) override {
    absl::MutexLock lock(&mu_);  // the thread driving the replica only, but OnEvent's contract
    if (event.kind == EventKind::kBackward &&
        (backward_start_ns_ < 0 || event.start_ns < backward_start_ns_)) {
      backward_start_ns_ = event.start_ns;
    }
  }

  // Per layer: forward and backward ns of the pass just run (the format's
  // definitions, model_profiler.h); kInternal if a layer was not seen.
  absl::Status Durations(std::vector<int64_t>* forward, std::vector<int64_t>* backward,
                         int64_t* total_forward, int64_t* total_backward) {
    absl::MutexLock lock(&mu_);
    const size_t n = begins_.size();
    for (size_t k = 0; k < n; ++k) {
      if (first_forward_[k] < 0 || last_backward_[k] < 0 || backward_start_ns_ < 0) {
        return absl::InternalError(absl::StrCat("layer ", k, " reported no hook or event"));
      }
    }
    for (size_t k = 0; k < n; ++k) {
      const int64_t from = k == 0 ? start_ns_ : first_forward_[k];
      const int64_t to = k + 1 < n ? first_forward_[k + 1] : backward_start_ns_;
      forward->push_back(to - from);
      const int64_t ready_from = k + 1 < n ? last_backward_[k + 1] : backward_start_ns_;
      backward->push_back(last_backward_[k] - ready_from);
    }
    *total_forward = backward_start_ns_ - start_ns_;
    *total_backward = last_backward_[0] - backward_start_ns_;
    return absl::OkStatus();
  }

 private:
  size_t LayerOf(int64_t begin) const {
    auto it = std::upper_bound(begins_.begin(), begins_.end(), begin);
    return static_cast<size_t>(it - begins_.begin()) - 1;
  }

  const Clock* const clock_;
  const std::vector<int64_t> begins_;
  int64_t start_ns_ = 0;
  std::vector<int64_t> first_forward_, last_backward_;
  absl::Mutex mu_;
  int64_t backward_start_ns_ ABSL_GUARDED_BY(mu_) = -1;
};

double MedianMs(std::vector<int64_t> ns) {
  std::sort(ns.begin(), ns.end());
  const size_t m = ns.size() / 2;
  const double median = ns.size() % 2 == 1 ? static_cast<double>(ns[m])
                                           : (static_cast<double>(ns[m - 1]) + ns[m]) / 2;
  return std::max(median, 0.0) / 1e6;
}

// The profile's tensors and layers (without times) of `model`.
void Describe(const model::Model& model, model::ModelProfile* out) {
  const std::vector<int64_t> begins = model.LayerParameterBegins();
  int64_t offset = 0;
  for (const ParamSpec& spec : model.parameters()) {
    out->tensors.push_back({spec.name, spec.shape, "float32"});
    const size_t k = static_cast<size_t>(std::upper_bound(begins.begin(), begins.end(), offset) -
                                         begins.begin()) -
                     1;
    if (out->layers.size() <= k) {
      out->layers.resize(k + 1);
      out->layers[k].name = spec.name.substr(0, spec.name.find('.'));
    }
    out->layers[k].tensors.push_back(spec.name);
    offset += NumElements(spec.shape);
  }
}

}  // namespace

absl::StatusOr<model::ModelProfile> MeasureModelProfile(model::Model& model, const Tensor& inputs,
                                                        const Tensor& labels, const Clock* clock,
                                                        const ModelProfilerOptions& options) {
  if (options.warmup_passes < 0 || options.passes < 1 || clock == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("profiling needs >= 0 warm-up passes, >= 1 timed ones and a clock; got ",
                     options.warmup_passes, " and ", options.passes));
  }
  const std::vector<int64_t> begins = model.LayerParameterBegins();
  if (begins.empty()) return absl::InvalidArgumentError("the model has no parameters to profile");
  model::ModelProfile profile;
  profile.model = options.model_name;
  profile.batch_size = inputs.dim(0);
  profile.input = options.input;
  profile.measured = options.measured;
  profile.measured.steps = options.passes;
  profile.measured.warmup_steps = options.warmup_passes;
  profile.measured.statistic = "median";
  Describe(model, &profile);

  PassTimer timer(clock, begins);
  std::vector<std::vector<int64_t>> forward(begins.size()), backward(begins.size());
  std::vector<int64_t> total_forward, total_backward;
  model.set_step(-1);
  for (int64_t pass = 0; pass < options.warmup_passes + options.passes; ++pass) {
    const bool timed = pass >= options.warmup_passes;
    if (timed) {
      model.set_parameter_hooks(&timer);
      model.set_observer(&timer, clock, kTrainerLane);
      timer.Begin();
    }
    absl::StatusOr<model::DeviceMetrics> metrics = model.ForwardBackward(inputs, labels);
    absl::Status synced = model.device()->Synchronize();
    model.set_parameter_hooks(nullptr);
    model.set_observer(nullptr, nullptr, kTrainerLane);
    PS_RETURN_IF_ERROR(metrics.status());
    PS_RETURN_IF_ERROR(synced);
    if (!timed) continue;
    std::vector<int64_t> f, b;
    int64_t tf = 0, tb = 0;
    PS_RETURN_IF_ERROR(timer.Durations(&f, &b, &tf, &tb));
    for (size_t k = 0; k < begins.size(); ++k) {
      forward[k].push_back(f[k]);
      backward[k].push_back(b[k]);
    }
    total_forward.push_back(tf);
    total_backward.push_back(tb);
  }
  for (size_t k = 0; k < begins.size(); ++k) {
    profile.layers[k].forward_ms = MedianMs(forward[k]);
    profile.layers[k].backward_ms = MedianMs(backward[k]);
  }
  profile.total_forward_ms = MedianMs(total_forward);
  profile.total_backward_ms = MedianMs(total_backward);
  return profile;
}

}  // namespace ps::worker
