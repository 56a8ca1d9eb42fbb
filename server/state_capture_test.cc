#include "server/state_capture.h"

#include <cmath>
#include <limits>
#include <vector>

#include "common/cpu_device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

ServerState Valid() {
  ServerState state;
  state.version = 7;
  state.steps_per_epoch = 10;
  state.signature = {{"w", {2}, DType::kF32}};
  state.parameters = {1, 2};
  state.momentum = {0.5f, 0.25f};
  return state;
}

TEST(CaptureServerStateTest, TakesTheTablesParametersAndTheOptimizersMomentum) {
  CpuDevice device(0, 1);
  ChunkLayout layout = *ChunkLayout::Make({{"w", {3}, DType::kF32}}, 2, 1 << 20);
  const ChunkTable table(std::move(layout), 2, 1, {1, 2, 3}, &device);
  OptimizerOptions options;
  options.sgd.momentum = 0.9f;
  const LossScaleState scale{256.f, 3, 1};
  // No update yet (no optimizer): zeros where the optimizer has momentum.
  ServerState state = CaptureServerState(table, nullptr, options, 5, -1, scale);
  EXPECT_EQ(state.version, 5);
  EXPECT_EQ(state.steps_per_epoch, 0) << "not known yet";
  EXPECT_THAT(state.parameters, ElementsAre(1, 2, 3));
  EXPECT_THAT(state.momentum, ElementsAre(0, 0, 0));
  EXPECT_EQ(state.signature.size(), 1u);
  EXPECT_EQ(state.loss_scale, 256.f);
  EXPECT_EQ(state.loss_scale_clean_iterations, 3);
  EXPECT_EQ(state.loss_scale_skipped_iterations, 1);
  std::unique_ptr<Optimizer> optimizer = *CreateOptimizer(options, 3, &device);
  ASSERT_TRUE(optimizer->RestoreMomentum({0.5f, 0.25f, 0.125f}).ok());
  state = CaptureServerState(table, optimizer.get(), options, 6, 10, scale);
  EXPECT_EQ(state.steps_per_epoch, 10);
  EXPECT_THAT(state.momentum, ElementsAre(0.5f, 0.25f, 0.125f));
  options.sgd.momentum = 0;
  EXPECT_TRUE(CaptureServerState(table, nullptr, options, 5, 1, scale).momentum.empty());
}

TEST(CheckServerStateTest, RefusesWhatNoServerCanResumeFromNamingIt) {
  EXPECT_TRUE(CheckServerState(Valid(), /*with_momentum=*/true, false).ok());
  auto refused = [](ServerState state, bool with_momentum = true, bool dynamic = false) {
    return std::string(CheckServerState(state, with_momentum, dynamic).message());
  };
  ServerState s = Valid();
  s.version = -1;
  EXPECT_THAT(refused(s), HasSubstr("a saved state of version -1"));
  s = Valid();
  s.signature.clear();
  EXPECT_THAT(refused(s), HasSubstr("empty signature"));
  s = Valid();
  s.momentum.push_back(0);
  EXPECT_THAT(refused(s), HasSubstr("the saved momentum has 3 elements, the parameters 2"));
  EXPECT_THAT(refused(Valid(), /*with_momentum=*/false), HasSubstr("uses none (--momentum=0)"));
  s = Valid();
  s.momentum.clear();
  EXPECT_THAT(refused(s), HasSubstr("has no momentum buffer"));
  s = Valid();
  s.momentum[1] = std::numeric_limits<float>::infinity();
  EXPECT_THAT(refused(s), HasSubstr("saved momentum element 1 is not finite"));
  s = Valid();
  s.loss_scale = 3;  // not a power of two
  EXPECT_TRUE(CheckServerState(s, true, /*dynamic_loss_scale=*/false).ok());
  EXPECT_THAT(refused(s, true, /*dynamic=*/true), HasSubstr("a saved loss scale of 3"));
}

TEST(CaptureRequestsTest, RequestsWaitForTheBoundaryTheyHoldBackUpdatesFor) {
  CaptureRequests requests;
  int served = 0;
  requests.Add([&](ServerState) { ++served; });
  EXPECT_FALSE(requests.HoldsBack(12));
  requests.HoldBackFrom(5);
  requests.HoldBackFrom(9);  // held back already: the first limit stays
  EXPECT_FALSE(requests.HoldsBack(4));
  EXPECT_TRUE(requests.HoldsBack(5));
  requests.NoteHeldBack();
  EXPECT_TRUE(requests.AtBoundary(4).captures.empty()) << "not the boundary yet";
  CaptureRequests::Release release = requests.AtBoundary(5);
  ASSERT_EQ(release.captures.size(), 1u);
  EXPECT_TRUE(release.resume);
  for (auto& done : release.captures) done(ServerState());
  EXPECT_EQ(served, 1);
  EXPECT_TRUE(requests.empty());
  EXPECT_FALSE(requests.HoldsBack(100)) << "nothing held back after the boundary";
  EXPECT_FALSE(requests.AtBoundary(6).resume);
}

TEST(CaptureRequestsTest, CancellingDropsTheRequestsAndReleasesTheUpdates) {
  CaptureRequests requests;
  requests.Add([](ServerState) { FAIL() << "a cancelled request is never served"; });
  requests.Add([](ServerState) { FAIL() << "a cancelled request is never served"; });
  requests.HoldBackFrom(3);
  requests.NoteHeldBack();
  int dropped = 0;
  EXPECT_TRUE(requests.Cancel(&dropped).resume);
  EXPECT_EQ(dropped, 2);
  EXPECT_FALSE(requests.HoldsBack(3));
  EXPECT_TRUE(requests.AtBoundary(3).captures.empty());
  EXPECT_EQ(requests.releases(), 0);
  requests.CountRelease();
  EXPECT_EQ(requests.releases(), 1);
}

}  // namespace
}  // namespace ps::server
