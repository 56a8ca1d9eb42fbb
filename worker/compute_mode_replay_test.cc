#include "common/fake_observer.h"
#include "worker/compute_mode_replay.h"

#include <memory>
#include <vector>

#include "common/cpu_device.h"
#include "common/timed_event.h"
#include "gtest/gtest.h"
#include "worker/compute_mode_test_util.h"

namespace ps::worker {
namespace {

using Point = ComputeProfile::Point;
using testing::JumpingClock;
using testing::RecordingHooks;
using ::ps::RecordingObserver;
using testing::StagedReplica;

constexpr int64_t kTickNs = 1000;

// Calibrates `replay` on `replica`'s staged shard; `staged` receives the
// passes asked for.
absl::Status Calibrate(ReplayCompute& replay, StagedReplica& replica,
                       std::vector<int64_t>* staged) {
  ComputeSetup setup;
  setup.stage_batch = [&](int64_t pass) -> absl::StatusOr<std::vector<DeviceShard>> {
    staged->push_back(pass);
    DeviceShard shard = replica.shard();
    shard.metrics = nullptr;
    return std::vector<DeviceShard>{shard};
  };
  return replay.Prepare(setup);
}

TEST(ReplayComputeTest, CalibrationTimesEachLayerPointOfTheRealPasses) {
  CpuDevice device(0, 1);
  auto replica = StagedReplica::Create(&device, 4);
  ASSERT_TRUE(replica.ok()) << replica.status();
  // Every reading moves the clock 1 us, and only the profiling hooks read
  // it: each gap of the profile is exactly one tick.
  JumpingClock clock(kTickNs);
  ReplayCompute replay(&clock, /*calibration_steps=*/3, /*step_seconds=*/0);
  EXPECT_EQ(replay.Name(), "replay");
  EXPECT_FALSE(replay.reads_data());
  std::vector<int64_t> staged;
  ASSERT_TRUE(Calibrate(replay, **replica, &staged).ok());
  EXPECT_EQ(staged, std::vector<int64_t>({0, 1, 2, 3, 4}));  // two warm-up passes, three timed
  const ComputeProfile* profile = replay.replay_profile();
  ASSERT_NE(profile, nullptr);
  EXPECT_EQ(profile->passes, 3);
  // Two Linear layers: each needed, each handing over early, each ready.
  int needs = 0, early = 0, readies = 0;
  for (const Point& p : profile->points) {
    needs += p.kind == Point::kNeedParameters;
    early += p.kind == Point::kGradientsEarly;
    readies += p.kind == Point::kGradientsReady;
    EXPECT_EQ(p.gap_ns, kTickNs);
  }
  EXPECT_EQ(needs, 2);
  EXPECT_EQ(early, 2);
  EXPECT_EQ(readies, 2);
  ASSERT_FALSE(profile->points.empty());
  EXPECT_EQ(profile->points.back().kind, Point::kEnd);
}

TEST(ReplayComputeTest, AStepReplaysTheProfilesPointsAtTheirGapsWithoutComputing) {
  CpuDevice device(0, 1);
  auto replica = StagedReplica::Create(&device, 4);
  ASSERT_TRUE(replica.ok()) << replica.status();
  JumpingClock clock(kTickNs);
  ReplayCompute replay(&clock, 2, 0);
  std::vector<int64_t> staged;
  ASSERT_TRUE(Calibrate(replay, **replica, &staged).ok());
  const ComputeProfile profile = *replay.replay_profile();
  const std::vector<float> gradients = *(*replica)->model().flat_gradients().ToVector();

  clock.set_tick_ns(0);  // from here the clock moves only by the replay's sleeps
  for (bool overlap : {true, false}) {
    SCOPED_TRACE(overlap ? "overlap" : "no overlap");
    RecordingHooks hooks(&clock);
    RecordingObserver observer;
    ComputeStep step;
    step.iteration = 7;
    step.shards = {(*replica)->shard()};
    step.observer = &observer;
    if (overlap) step.overlap = {&hooks};
    const int64_t start = clock.NowNanos();
    const size_t sleeps_before = clock.sleeps_ns().size();
    ASSERT_TRUE(replay.Compute(step).ok());

    // One sleep per point, of its gap; each hook called after its gap.
    const std::vector<int64_t> sleeps = clock.sleeps_ns();
    ASSERT_EQ(sleeps.size() - sleeps_before, profile.points.size());
    std::vector<RecordingHooks::Call> want;
    int64_t at = start;
    for (size_t i = 0; i < profile.points.size(); ++i) {
      const Point& p = profile.points[i];
      EXPECT_EQ(sleeps[sleeps_before + i], p.gap_ns) << i;
      at += p.gap_ns;
      if (p.kind == Point::kEnd) continue;
      const RecordingHooks::Kind kind = p.kind == Point::kNeedParameters
                                            ? RecordingHooks::kBeforeForward
                                        : p.kind == Point::kGradientsEarly
                                            ? RecordingHooks::kGradientsReady
                                            : RecordingHooks::kAfterBackward;
      want.push_back({kind, p.begin, p.end, at});
    }
    const std::vector<RecordingHooks::Call>& calls = hooks.calls();
    ASSERT_EQ(calls.size(), overlap ? want.size() : 0u);
    for (size_t i = 0; i < calls.size(); ++i) {
      EXPECT_EQ(calls[i].kind, want[i].kind) << i;
      EXPECT_EQ(calls[i].begin, want[i].begin) << i;
      EXPECT_EQ(calls[i].end, want[i].end) << i;
      EXPECT_EQ(calls[i].at_ns, want[i].at_ns) << i;
    }
    // The device lane's compute spans the replayed pass.
    const std::vector<TimedEvent> events = observer.events();
    ASSERT_EQ(events.size(), 1u);
    EXPECT_EQ(events[0].kind, EventKind::kCompute);
    EXPECT_EQ(events[0].lane, DeviceLane(0));
    EXPECT_EQ(events[0].step, 7);
    EXPECT_EQ(events[0].end_ns - events[0].start_ns, profile.step_ns());
    // Nothing ran: the gradients are the last real pass's.
    EXPECT_EQ(*(*replica)->model().flat_gradients().ToVector(), gradients);
    EXPECT_EQ((*replica)->metrics(), std::vector<float>({0, 0}));
  }
}

TEST(ReplayComputeTest, AStepTimeScalesEveryGapInProportion) {
  CpuDevice device(0, 1);
  auto replica = StagedReplica::Create(&device, 4);
  ASSERT_TRUE(replica.ok()) << replica.status();
  JumpingClock clock(kTickNs);
  ReplayCompute replay(&clock, 1, /*step_seconds=*/0.01);
  std::vector<int64_t> staged;
  ASSERT_TRUE(Calibrate(replay, **replica, &staged).ok());
  const ComputeProfile& profile = *replay.replay_profile();
  const int64_t points = static_cast<int64_t>(profile.points.size());
  for (const Point& p : profile.points) EXPECT_NEAR(p.gap_ns, 10000000 / points, 1);
  EXPECT_NEAR(profile.step_ns(), 10000000, points);
}

TEST(ReplayComputeTest, CalibrationReturnsTheStagingsError) {
  JumpingClock clock;
  ReplayCompute replay(&clock, 1, 0);
  ComputeSetup setup;
  setup.stage_batch = [](int64_t) -> absl::StatusOr<std::vector<DeviceShard>> {
    return absl::DataLossError("bad sample");
  };
  EXPECT_EQ(replay.Prepare(setup).code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace ps::worker
