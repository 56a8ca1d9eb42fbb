#include "worker/compute_mode_factory.h"

#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace ps::worker {
namespace {

TEST(MakeComputeModeTest, BuildsRealOrReplayUnderAnOptionalSlowdown) {
  FakeClock clock;
  ComputeModeOptions options;
  auto real = MakeComputeMode(options, 2, &clock);
  ASSERT_TRUE(real.ok()) << real.status();
  EXPECT_EQ((*real)->Name(), "real");
  EXPECT_TRUE((*real)->reads_data());
  options.slowdown = 2;
  auto slowed = MakeComputeMode(options, 2, &clock);
  ASSERT_TRUE(slowed.ok()) << slowed.status();
  EXPECT_EQ((*slowed)->Name(), "real");
  options.replay = true;
  auto replay = MakeComputeMode(options, 1, &clock);
  ASSERT_TRUE(replay.ok()) << replay.status();
  EXPECT_EQ((*replay)->Name(), "replay");
  EXPECT_FALSE((*replay)->reads_data());
  EXPECT_NE((*replay)->replay_profile(), nullptr);
}

TEST(MakeComputeModeTest, RefusesABadValueOrCombinationNamingIt) {
  FakeClock clock;
  struct Case {
    ComputeModeOptions options;
    int devices;
    const char* says;
  };
  std::vector<Case> cases(6);
  cases[0].options.slowdown = 0.5;
  cases[0].says = "slowdown must be >= 1";
  cases[1].options.slowdown = std::numeric_limits<double>::quiet_NaN();
  cases[1].says = "slowdown must be >= 1";
  cases[2].options.slowdown_period = -1;
  cases[2].says = "period >= 0";
  cases[3].options.replay = true;
  cases[3].devices = 2;
  cases[3].says = "one device, not 2";
  cases[4].options.replay = true;
  cases[4].options.replay_calibration_steps = 0;
  cases[4].says = "at least one calibration step";
  cases[5].says = "clock";
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    auto mode = MakeComputeMode(c.options, c.devices == 0 ? 1 : c.devices,
                                i == 5 ? nullptr : &clock);
    EXPECT_EQ(mode.status().code(), absl::StatusCode::kInvalidArgument) << i;
    EXPECT_NE(mode.status().message().find(c.says), absl::string_view::npos)
        << i << ": " << mode.status();
  }
}

}  // namespace
}  // namespace ps::worker
