#include "common/fake_observer.h"
#include "worker/compute_mode_real.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "common/cpu_device.h"
#include "common/timed_event.h"
#include "gtest/gtest.h"
#include "worker/compute_mode_test_util.h"
#include "worker/device_threads.h"

namespace ps::worker {
namespace {

using testing::JumpingClock;
using testing::RecordingHooks;
using ::ps::RecordingObserver;
using testing::StagedReplica;

TEST(RealComputeTest, EveryDeviceComputesItsShardAndAnEmptyShardAZeroGradient) {
  CpuDevice a(0, 1), b(1, 1), c(2, 1);
  auto full = StagedReplica::Create(&a, 4);
  auto empty = StagedReplica::Create(&b, 0);
  auto reference = StagedReplica::Create(&c, 4);  // the same pass, run directly
  ASSERT_TRUE(full.ok() && empty.ok() && reference.ok());
  const std::vector<float> ones((*empty)->model().flat_gradients().num_elements(), 1.f);
  ASSERT_TRUE((*empty)->model().flat_gradients().CopyFromHost(ones).ok());
  auto want = (*reference)->model().ForwardBackward((*reference)->shard().inputs,
                                                    (*reference)->shard().labels);
  ASSERT_TRUE(want.ok()) << want.status();

  JumpingClock clock(1000);
  RealCompute real(&clock);
  EXPECT_EQ(real.Name(), "real");
  EXPECT_TRUE(real.reads_data());
  EXPECT_EQ(real.replay_profile(), nullptr);
  DeviceThreads threads(2);
  RecordingObserver observer;
  ComputeStep step;
  step.iteration = 5;
  step.shards = {(*full)->shard(), (*empty)->shard()};
  step.device_threads = &threads;
  step.observer = &observer;
  ASSERT_TRUE(real.Compute(step).ok());

  EXPECT_EQ(*(*full)->model().flat_gradients().ToVector(),
            *(*reference)->model().flat_gradients().ToVector());
  const std::vector<float> zeroed = *(*empty)->model().flat_gradients().ToVector();
  EXPECT_EQ(zeroed, std::vector<float>(ones.size(), 0.f));
  // The loss and correct count went to each shard's metrics.
  const std::vector<float> metrics = (*full)->metrics();
  EXPECT_EQ(metrics[0], *want->loss_sum);
  EXPECT_EQ(metrics[1], *want->correct);
  EXPECT_GT(metrics[0], 0.f);
  EXPECT_EQ((*empty)->metrics(), std::vector<float>({0, 0}));
  // One compute event per device, on its lane, of the step.
  std::vector<int32_t> lanes;
  for (const TimedEvent& e : observer.events()) {
    EXPECT_EQ(e.kind, EventKind::kCompute);
    EXPECT_EQ(e.step, 5);
    EXPECT_GT(e.end_ns, e.start_ns);
    lanes.push_back(e.lane);
  }
  std::sort(lanes.begin(), lanes.end());
  EXPECT_EQ(lanes, std::vector<int32_t>({DeviceLane(0), DeviceLane(1)}));
}

TEST(RealComputeTest, OverlappingThePassCallsTheHooksLayerByLayerThenLetsThemGo) {
  CpuDevice device(0, 1);
  auto replica = StagedReplica::Create(&device, 4);
  ASSERT_TRUE(replica.ok()) << replica.status();
  JumpingClock clock;
  RealCompute real(&clock);
  DeviceThreads threads(1);
  RecordingHooks hooks(&clock);
  ComputeStep step;
  step.shards = {(*replica)->shard()};
  step.device_threads = &threads;
  step.overlap = {&hooks};
  step.await_all_parameters = [] { return absl::InternalError("no pass waits for all"); };
  ASSERT_TRUE(real.Compute(step).ok());
  // Two layers forward in order, handed over in reverse: [begin of layer 1,
  // begin of layer 0] as the parameters' layout says.
  const std::vector<int64_t> begins = (*replica)->model().LayerParameterBegins();
  ASSERT_EQ(begins.size(), 2u);
  std::vector<int64_t> forward, ready;
  for (const RecordingHooks::Call& call : hooks.calls()) {
    if (call.kind == RecordingHooks::kBeforeForward) forward.push_back(call.begin);
    if (call.kind == RecordingHooks::kAfterBackward) ready.push_back(call.begin);
  }
  EXPECT_EQ(forward, begins);
  EXPECT_EQ(ready, std::vector<int64_t>({begins[1], begins[0]}));
  // The replica no longer calls them.
  const size_t calls = hooks.calls().size();
  ASSERT_TRUE((*replica)->model().ForwardBackward((*replica)->shard().inputs,
                                                  (*replica)->shard().labels).ok());
  EXPECT_EQ(hooks.calls().size(), calls);
}

TEST(RealComputeTest, OverlappingAnEmptyShardWaitsForEveryParameterAndSaysWhyNot) {
  CpuDevice device(0, 1);
  auto replica = StagedReplica::Create(&device, 0);
  ASSERT_TRUE(replica.ok()) << replica.status();
  JumpingClock clock;
  RealCompute real(&clock);
  DeviceThreads threads(1);
  RecordingHooks hooks(&clock);
  int waits = 0;
  ComputeStep step;
  step.shards = {(*replica)->shard()};
  step.device_threads = &threads;
  step.overlap = {&hooks};
  step.await_all_parameters = [&] {
    ++waits;
    return absl::OkStatus();
  };
  ASSERT_TRUE(real.Compute(step).ok());
  EXPECT_EQ(waits, 1);
  EXPECT_TRUE(hooks.calls().empty());
  step.await_all_parameters = [] { return absl::UnavailableError("server lost"); };
  EXPECT_EQ(real.Compute(step).code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace ps::worker
