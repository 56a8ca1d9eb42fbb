#include "worker/model/profile_model.h"

#include <atomic>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/clock.h"
#include "common/cpu_device.h"
#include "common/timed_event.h"
#include "gtest/gtest.h"
#include "worker/model/model.h"
#include "worker/model/model_profile.h"
#include "worker/model/parameter_hooks.h"

namespace ps::worker::model {
namespace {

// A clock that a sleep moves to its deadline at once, so a test sees the
// replayed times exactly without waiting.
class JumpClock final : public Clock {
 public:
  int64_t NowNanos() const override { return now_ns_; }
  bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& condition,
                         int64_t deadline_ns) const override {
    if (condition.Eval()) return true;
    if (deadline_ns > now_ns_) now_ns_ = deadline_ns;
    return condition.Eval();
  }
  void Advance(int64_t ns) { now_ns_ += ns; }

 private:
  mutable std::atomic<int64_t> now_ns_{1000};
};

// Each hook call with the clock's reading; BeforeForward of the second
// layer waits `wait_ns` for its parameters.
class Recorder final : public ParameterHooks {
 public:
  Recorder(JumpClock* clock, int64_t wait_ns) : clock_(clock), wait_ns_(wait_ns) {}
  absl::Status BeforeForward(int64_t begin, int64_t end) override {
    if (begin > 0) clock_->Advance(wait_ns_);
    calls.push_back({'F', begin, end, clock_->NowNanos()});
    return absl::OkStatus();
  }
  void AfterBackward(int64_t begin, int64_t end) override {
    calls.push_back({'B', begin, end, clock_->NowNanos()});
  }
  struct Call {
    char kind;
    int64_t begin, end, at_ns;
  };
  std::vector<Call> calls;

 private:
  JumpClock* clock_;
  int64_t wait_ns_;
};

class Events final : public EventObserver {
 public:
  void OnEvent(const TimedEvent& e) override {
    seen.push_back(std::string(e.kind == EventKind::kForward ? "F:" : "B:") + std::string(e.name));
  }
  std::vector<std::string> seen;
};

// Two layers: "a" (a.weight [4, 3], a.bias [4]: 16 elements) and "b"
// (b.weight [2, 4]: 8), measured at batch 8.
ModelProfile Tiny() {
  ModelProfile p;
  p.model = "tiny";
  p.batch_size = 8;
  p.tensors = {
      {"a.weight", {4, 3}, "float32"}, {"a.bias", {4}, "float32"}, {"b.weight", {2, 4}, "float32"}};
  p.layers = {{"a", {"a.weight", "a.bias"}, 2.0, 4.0}, {"b", {"b.weight"}, 1.0, 3.0}};
  return p;
}

ModelConfig Config(ModelProfile profile, const Clock* clock) {
  ModelConfig config;
  config.name = "profile";
  config.profile = std::make_shared<const ModelProfile>(std::move(profile));
  config.profile_clock = clock;
  return config;
}

TEST(ProfileModelTest, ItsParametersAreTheProfilesTensorsInOrder) {
  CpuDevice device(0, 1);
  JumpClock clock;
  auto model = Model::Create(Config(Tiny(), &clock), &device);
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<ParamSpec>& specs = (*model)->parameters();
  ASSERT_EQ(specs.size(), 3u);
  EXPECT_EQ(specs[0], (ParamSpec{"a.weight", {4, 3}, DType::kF32}));
  EXPECT_EQ(specs[1], (ParamSpec{"a.bias", {4}, DType::kF32}));
  EXPECT_EQ(specs[2], (ParamSpec{"b.weight", {2, 4}, DType::kF32}));
  EXPECT_EQ((*model)->flat_parameters().num_elements(), 24);
  EXPECT_EQ((*model)->flat_gradients().num_elements(), 24);
  EXPECT_TRUE((*model)->buffers().empty());
  EXPECT_EQ((*model)->LayerParameterBegins(), (std::vector<int64_t>{0, 16}));
  auto bias = (*model)->Find("a.bias");
  ASSERT_TRUE(bias.ok()) << bias.status();
  EXPECT_EQ(bias->shape(), (Shape{4}));
  EXPECT_EQ((*model)->Find("c").status().code(), absl::StatusCode::kNotFound);
}

TEST(ProfileModelTest, APassReplaysEachLayerScaledByTheBatchThroughTheHooks) {
  CpuDevice device(0, 1);
  JumpClock clock;
  auto model = Model::Create(Config(Tiny(), &clock), &device);
  ASSERT_TRUE(model.ok()) << model.status();
  Recorder hooks(&clock, /*wait_ns=*/500'000);
  Events events;
  (*model)->set_parameter_hooks(&hooks);
  (*model)->set_observer(&events, &clock, 0);
  (*model)->set_loss_scale(2.f);
  // 4 samples: half the profile's batch of 8, so half its times.
  auto inputs = Tensor::Zeros(&device, {4, 1});
  auto labels = Tensor::Zeros(&device, {4}, DType::kI32);
  const int64_t start = clock.NowNanos();
  ASSERT_TRUE((*model)->ForwardBackward(*inputs, *labels).ok());
  ASSERT_EQ(hooks.calls.size(), 4u);
  // Forward: a at once; b after a's 1 ms and the 0.5 ms wait; backward: b's
  // 1.5 ms after b's forward 0.5 ms, then a's 2 ms.
  EXPECT_EQ(hooks.calls[0].kind, 'F');
  EXPECT_EQ(hooks.calls[0].begin, 0);
  EXPECT_EQ(hooks.calls[0].end, 16);
  EXPECT_EQ(hooks.calls[0].at_ns, start);
  EXPECT_EQ(hooks.calls[1].kind, 'F');
  EXPECT_EQ(hooks.calls[1].begin, 16);
  EXPECT_EQ(hooks.calls[1].end, 24);
  EXPECT_EQ(hooks.calls[1].at_ns, start + 1'500'000);
  EXPECT_EQ(hooks.calls[2].kind, 'B');
  EXPECT_EQ(hooks.calls[2].begin, 16);
  EXPECT_EQ(hooks.calls[2].at_ns, start + 3'500'000);
  EXPECT_EQ(hooks.calls[3].kind, 'B');
  EXPECT_EQ(hooks.calls[3].begin, 0);
  EXPECT_EQ(hooks.calls[3].at_ns, start + 5'500'000);
  EXPECT_EQ(events.seen, (std::vector<std::string>{"F:a", "F:b", "B:b", "B:a"}));
  // Gradients: n * loss_scale * 1e-3 * ((i mod 7) - 3).
  auto grads = (*model)->flat_gradients().ToVector();
  ASSERT_TRUE(grads.ok());
  for (int64_t i = 0; i < 24; ++i) {
    EXPECT_FLOAT_EQ((*grads)[i], 4 * 2.f * 1e-3f * static_cast<float>(i % 7 - 3)) << i;
  }
}

TEST(ProfileModelTest, RefusesWhatItCannotReplayNamingIt) {
  CpuDevice device(0, 1);
  ModelProfile half = Tiny();
  half.tensors[1].dtype = "float16";
  auto model = Model::Create(Config(half, nullptr), &device);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(model.status().message(), "tensors[1] 'a.bias' is float16"))
      << model.status();

  ModelProfile apart = Tiny();
  apart.layers[0].tensors = {"a.weight", "b.weight"};
  apart.layers[1].tensors = {"a.bias"};
  model = Model::Create(Config(apart, nullptr), &device);
  ASSERT_FALSE(model.ok());
  EXPECT_TRUE(absl::StrContains(model.status().message(), "layers[0] 'a'")) << model.status();

  ModelConfig none;
  none.name = "profile";
  model = Model::Create(none, &device);
  ASSERT_FALSE(model.ok());
  EXPECT_TRUE(absl::StrContains(model.status().message(), "--model_profile")) << model.status();
}

}  // namespace
}  // namespace ps::worker::model
