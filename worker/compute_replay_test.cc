#include "worker/compute_replay.h"

#include "common/clock.h"
#include "gtest/gtest.h"

namespace ps::worker {
namespace {

using Point = ComputeProfile::Point;

// A two-layer pass on a fake clock: 1 ms to layer A's forward, 2 ms of A,
// 3 ms of B and the loss and B's backward, 4 ms of A's backward, 5 ms to
// the end.
absl::Status Pass(ProfilingHooks& hooks, FakeClock& clock, int64_t scale) {
  hooks.BeginPass();
  clock.Advance(1000000 * scale);
  if (absl::Status s = hooks.BeforeForward(0, 10); !s.ok()) return s;
  clock.Advance(2000000 * scale);
  if (absl::Status s = hooks.BeforeForward(10, 30); !s.ok()) return s;
  clock.Advance(3000000 * scale);
  hooks.AfterBackward(10, 30);
  clock.Advance(4000000 * scale);
  hooks.AfterBackward(0, 10);
  clock.Advance(5000000 * scale);
  return hooks.EndPass();
}

TEST(ComputeReplayTest, TheProfileIsEachPointWithItsAverageGap) {
  FakeClock clock;
  ProfilingHooks hooks(&clock);
  ASSERT_TRUE(Pass(hooks, clock, 1).ok());
  ASSERT_TRUE(Pass(hooks, clock, 3).ok());
  const ComputeProfile p = hooks.profile();
  EXPECT_EQ(p.passes, 2);
  ASSERT_EQ(p.points.size(), 5u);
  const Point::Kind kinds[] = {Point::kNeedParameters, Point::kNeedParameters,
                               Point::kGradientsReady, Point::kGradientsReady, Point::kEnd};
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(p.points[i].kind, kinds[i]) << i;
    EXPECT_EQ(p.points[i].gap_ns, (i + 1) * 2000000) << i;  // the mean of 1x and 3x
  }
  EXPECT_EQ(p.points[1].begin, 10);
  EXPECT_EQ(p.points[1].end, 30);
  EXPECT_EQ(p.points[3].begin, 0);
  EXPECT_EQ(p.step_ns(), 30000000);
}

TEST(ComputeReplayTest, APassThatReachesOtherPointsIsRefused) {
  FakeClock clock;
  ProfilingHooks hooks(&clock);
  ASSERT_TRUE(Pass(hooks, clock, 1).ok());
  hooks.BeginPass();
  ASSERT_TRUE(hooks.BeforeForward(0, 10).ok());
  EXPECT_EQ(hooks.EndPass().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace ps::worker
