#ifndef PS_WORKER_COMPUTE_MODE_TEST_UTIL_H_
#define PS_WORKER_COMPUTE_MODE_TEST_UTIL_H_

// Test doubles for the compute modes' tests.

#include <atomic>
#include <cstdint>
#include <vector>

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/device.h"
#include "common/status_macros.h"
#include "common/tensor.h"
#include "common/timed_event.h"
#include "worker/compute_mode.h"
#include "worker/model/model.h"
#include "worker/model/parameter_hooks.h"

namespace ps::worker::testing {

// A clock that moves only when told to (Advance) or when someone sleeps on
// it: a sleep jumps the clock to its deadline at once and is recorded, so a
// test sees exactly how long the code under test slept, without sleeping.
// `tick_ns` > 0: every reading also moves the clock that much first, so
// every measured interval is known. Thread-safe (a trainer's device and
// store threads may read it too).
class JumpingClock final : public Clock {
 public:
  explicit JumpingClock(int64_t tick_ns = 0) : tick_ns_(tick_ns) {}

  void set_tick_ns(int64_t ns) { tick_ns_ = ns; }
  // Every sleep then lasts this much longer than asked (a real sleep's
  // overshoot).
  void set_overshoot_ns(int64_t ns) { overshoot_ns_ = ns; }

  int64_t NowNanos() const override {
    const int64_t tick = tick_ns_;
    return now_ns_.fetch_add(tick) + tick;
  }
  bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& condition,
                         int64_t deadline_ns) const override {
    if (condition.Eval()) return true;
    {
      absl::MutexLock lock(&sleeps_mu_);
      const int64_t now = now_ns_;
      sleeps_ns_.push_back(deadline_ns > now ? deadline_ns - now : 0);
      if (deadline_ns > now) now_ns_ = deadline_ns + overshoot_ns_;
    }
    return condition.Eval();
  }

  void Advance(int64_t ns) { now_ns_ += ns; }
  // What each sleep asked for, in order (0 for a deadline already past).
  std::vector<int64_t> sleeps_ns() const {
    absl::MutexLock lock(&sleeps_mu_);
    return sleeps_ns_;
  }
  int64_t slept_ns() const {
    int64_t total = 0;
    for (int64_t ns : sleeps_ns()) total += ns;
    return total;
  }

 private:
  std::atomic<int64_t> tick_ns_;
  std::atomic<int64_t> overshoot_ns_{0};
  mutable std::atomic<int64_t> now_ns_{0};
  mutable absl::Mutex sleeps_mu_;
  mutable std::vector<int64_t> sleeps_ns_ ABSL_GUARDED_BY(sleeps_mu_);
};

// Records each hook call with the clock's reading; BeforeForward advances a
// JumpingClock by `wait_ns` (a wait for parameters) when one is given.
class RecordingHooks final : public model::ParameterHooks {
 public:
  enum Kind { kBeforeForward, kGradientsReady, kAfterBackward };
  struct Call {
    Kind kind;
    int64_t begin, end;
    int64_t at_ns;  // the clock's reading when the call came
  };

  explicit RecordingHooks(const Clock* clock, JumpingClock* waits_on = nullptr,
                          int64_t wait_ns = 0)
      : clock_(clock), waits_on_(waits_on), wait_ns_(wait_ns) {}

  absl::Status BeforeForward(int64_t begin, int64_t end) override {
    calls_.push_back({kBeforeForward, begin, end, clock_->NowNanos()});
    if (waits_on_ != nullptr) waits_on_->Advance(wait_ns_);
    return absl::OkStatus();
  }
  void GradientsReady(int64_t begin, int64_t end) override {
    calls_.push_back({kGradientsReady, begin, end, clock_->NowNanos()});
  }
  void AfterBackward(int64_t begin, int64_t end) override {
    calls_.push_back({kAfterBackward, begin, end, clock_->NowNanos()});
  }

  const std::vector<Call>& calls() const { return calls_; }

 private:
  const Clock* const clock_;
  JumpingClock* const waits_on_;
  const int64_t wait_ns_;
  std::vector<Call> calls_;
};

// A small MLP replica (two Linear layers: 16 -> 8 -> 3) on `device` with a
// shard of `n` samples staged (inputs and labels that vary with the sample),
// as the trainer would lend it: shard() points at its own metrics.
class StagedReplica {
 public:
  static absl::StatusOr<std::unique_ptr<StagedReplica>> Create(Device* device, int64_t n) {
    auto r = std::unique_ptr<StagedReplica>(new StagedReplica());
    model::ModelConfig config;
    config.name = "mlp";
    config.input_shape = {1, 4, 4};
    config.num_classes = 3;
    config.mlp_hidden = {8};
    PS_ASSIGN_OR_RETURN(r->model_, model::Model::Create(config, device));
    PS_RETURN_IF_ERROR(r->model_->Initialize(1));
    r->shard_.device = device;
    r->shard_.model = r->model_.get();
    r->shard_.size = n;
    PS_ASSIGN_OR_RETURN(r->metrics_, Tensor::Zeros(device, {2}));
    r->shard_.metrics = &r->metrics_;
    if (n == 0) return r;
    std::vector<float> inputs(n * 16);
    for (size_t i = 0; i < inputs.size(); ++i) inputs[i] = static_cast<float>(i % 7) / 7 - 0.4f;
    PS_ASSIGN_OR_RETURN(r->shard_.inputs, Tensor::FromHost(device, {n, 1, 4, 4}, inputs));
    PS_ASSIGN_OR_RETURN(r->shard_.labels, Tensor::Empty(device, {n}, DType::kI32));
    for (int64_t i = 0; i < n; ++i) r->shard_.labels.mutable_data<int32_t>()[i] = i % 3;
    return r;
  }

  model::Model& model() { return *model_; }
  const DeviceShard& shard() const { return shard_; }
  // The summed loss and correct count accumulated so far.
  std::vector<float> metrics() const { return *metrics_.ToVector(); }

 private:
  StagedReplica() = default;
  std::unique_ptr<model::Model> model_;
  Tensor metrics_;
  DeviceShard shard_;
};

}  // namespace ps::worker::testing

#endif  // PS_WORKER_COMPUTE_MODE_TEST_UTIL_H_
