#include "worker/compute_mode_slowdown.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "worker/compute_mode_test_util.h"

namespace ps::worker {
namespace {

using testing::JumpingClock;
using testing::RecordingHooks;

constexpr int64_t kMs = 1000000;

// An inner mode whose pass is a script on the clock: 2 ms of compute, layer
// [0, 10)'s forward (its hook), 3 ms, the layer's backward done (its hook),
// 1 ms to the end. Without hooks, the same 6 ms in one piece.
class ScriptedCompute final : public ComputeMode {
 public:
  explicit ScriptedCompute(JumpingClock* clock) : clock_(clock) {}

  std::string Name() const override { return "scripted"; }
  absl::Status Prepare(const ComputeSetup& setup) override {
    prepared_rank = setup.rank;
    return absl::OkStatus();
  }
  bool reads_data() const override { return false; }
  absl::Status Compute(ComputeStep& step) override {
    ++passes;
    if (!error.ok()) return error;
    clock_->Advance(2 * kMs);
    if (!step.overlap.empty()) {
      if (absl::Status s = step.overlap[0]->BeforeForward(0, 10); !s.ok()) return s;
    }
    clock_->Advance(3 * kMs);
    if (!step.overlap.empty()) step.overlap[0]->AfterBackward(0, 10);
    clock_->Advance(1 * kMs);
    return absl::OkStatus();
  }

  int prepared_rank = -1;
  int passes = 0;
  absl::Status error;

 private:
  JumpingClock* const clock_;
};

struct Slowed {
  ScriptedCompute* inner;
  std::unique_ptr<SlowdownCompute> mode;
};

Slowed Slow(JumpingClock* clock, double slowdown, int64_t period = 0, int rank = 0) {
  auto inner = std::make_unique<ScriptedCompute>(clock);
  Slowed out{inner.get(), nullptr};
  out.mode = std::make_unique<SlowdownCompute>(std::move(inner), clock, slowdown, period);
  ComputeSetup setup;
  setup.rank = rank;
  EXPECT_TRUE(out.mode->Prepare(setup).ok());
  return out;
}

TEST(SlowdownComputeTest, WithoutOverlapItSleepsOnceAfterThePassForTheExactExtraTime) {
  JumpingClock clock;
  Slowed slowed = Slow(&clock, 3);
  ComputeStep step;
  ASSERT_TRUE(slowed.mode->Compute(step).ok());
  // The 6 ms pass takes 18 ms: one sleep of 2 x 6 ms after it.
  EXPECT_EQ(clock.sleeps_ns(), std::vector<int64_t>({12 * kMs}));
  EXPECT_EQ(clock.NowNanos(), 18 * kMs);
  EXPECT_TRUE(step.overlap.empty());
}

TEST(SlowdownComputeTest, OverlappingItStretchesEachPartAndLeavesTheWaitsOut) {
  JumpingClock clock;
  Slowed slowed = Slow(&clock, 2);
  // The inner hooks wait 5 ms for the layer's parameters.
  RecordingHooks hooks(&clock, &clock, 5 * kMs);
  ComputeStep step;
  step.overlap = {&hooks};
  ASSERT_TRUE(slowed.mode->Compute(step).ok());
  // 2 ms before the forward hook, 3 ms after the wait, 1 ms of tail: each
  // part stretched once more, the wait not at all.
  EXPECT_EQ(clock.sleeps_ns(), std::vector<int64_t>({2 * kMs, 3 * kMs, 1 * kMs}));
  ASSERT_EQ(hooks.calls().size(), 2u);
  EXPECT_EQ(hooks.calls()[0].kind, RecordingHooks::kBeforeForward);
  EXPECT_EQ(hooks.calls()[0].at_ns, 4 * kMs);  // when a host half as fast would get there
  EXPECT_EQ(hooks.calls()[1].kind, RecordingHooks::kAfterBackward);
  EXPECT_EQ(hooks.calls()[1].at_ns, (4 + 5 + 6) * kMs);
  EXPECT_EQ(clock.NowNanos(), (4 + 5 + 6 + 2) * kMs);
  // The step's hooks given back.
  EXPECT_EQ(step.overlap, std::vector<model::ParameterHooks*>{&hooks});
}

TEST(SlowdownComputeTest, WhatASleepOvershootsIsOwedBackToTheNext) {
  JumpingClock clock;
  clock.set_overshoot_ns(kMs / 2);
  Slowed slowed = Slow(&clock, 2);
  RecordingHooks hooks(&clock);
  ComputeStep step;
  step.overlap = {&hooks};
  ASSERT_TRUE(slowed.mode->Compute(step).ok());
  // Each sleep lasts 0.5 ms longer than asked: the next asks that much less.
  EXPECT_EQ(clock.sleeps_ns(),
            std::vector<int64_t>({2 * kMs, 3 * kMs - kMs / 2, 1 * kMs - kMs / 2}));
}

TEST(SlowdownComputeTest, WithAPeriodEachRankIsSlowInAlternateBlocks) {
  for (int rank : {0, 1}) {
    SCOPED_TRACE(rank);
    JumpingClock clock;
    Slowed slowed = Slow(&clock, 2, /*period=*/2, rank);
    EXPECT_EQ(slowed.inner->prepared_rank, rank);
    for (int64_t iteration = 0; iteration < 6; ++iteration) {
      const bool slow = (iteration / 2 + rank) % 2 == 0;
      EXPECT_EQ(slowed.mode->SlowdownAt(iteration), slow ? 2 : 1) << iteration;
      ComputeStep step;
      step.iteration = iteration;
      const int64_t slept_before = clock.slept_ns();
      ASSERT_TRUE(slowed.mode->Compute(step).ok());
      EXPECT_EQ(clock.slept_ns() - slept_before, slow ? 6 * kMs : 0) << iteration;
    }
    EXPECT_EQ(slowed.inner->passes, 6);
  }
}

TEST(SlowdownComputeTest, SaysWhatItsInnerModeSaysAndDoesNotSleepAfterAnError) {
  JumpingClock clock;
  Slowed slowed = Slow(&clock, 4);
  EXPECT_EQ(slowed.mode->Name(), "scripted");
  EXPECT_FALSE(slowed.mode->reads_data());
  EXPECT_EQ(slowed.mode->replay_profile(), nullptr);
  slowed.inner->error = absl::UnavailableError("device lost");
  ComputeStep step;
  EXPECT_EQ(slowed.mode->Compute(step).code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(clock.sleeps_ns().empty());
}

}  // namespace
}  // namespace ps::worker
