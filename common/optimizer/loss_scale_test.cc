#include "common/optimizer/loss_scale.h"

#include "gtest/gtest.h"

namespace ps {
namespace {

TEST(LossScaleTest, OnlyPowersOfTwoInRangeAreValid) {
  EXPECT_TRUE(IsValidLossScale(1.f));
  EXPECT_TRUE(IsValidLossScale(65536.f));
  EXPECT_TRUE(IsValidLossScale(kMinLossScale));
  EXPECT_TRUE(IsValidLossScale(kMaxLossScale));
  EXPECT_FALSE(IsValidLossScale(3.f));
  EXPECT_FALSE(IsValidLossScale(0.f));
  EXPECT_FALSE(IsValidLossScale(-2.f));
  EXPECT_FALSE(IsValidLossScale(kMaxLossScale * 2));
  EXPECT_FALSE(IsValidLossScale(kMinLossScale / 2));
}

TEST(LossScaleTest, ValidationNamesTheField) {
  LossScaleOptions options;
  options.initial = 3;  // ignored while not dynamic
  EXPECT_TRUE(ValidateLossScaleOptions(options).ok());
  options.dynamic = true;
  absl::Status status = ValidateLossScaleOptions(options);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("initial loss scale"), absl::string_view::npos) << status;
  options.initial = 1024;
  options.growth_interval = 0;
  status = ValidateLossScaleOptions(options);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("growth interval"), absl::string_view::npos) << status;
}

TEST(LossScaleTest, HalvesOnOverflowAndDoublesAfterCleanIterations) {
  LossScaleOptions options;
  options.dynamic = true;
  options.initial = 8;
  LossScaleState state = LossScaleState::Initial(options);
  EXPECT_EQ(state.scale, 8);
  state.Advance(/*overflow=*/true, /*growth_interval=*/2);
  EXPECT_EQ(state.scale, 4);
  EXPECT_EQ(state.skipped_iterations, 1);
  state.Advance(false, 2);
  EXPECT_EQ(state.scale, 4);
  EXPECT_EQ(state.clean_iterations, 1);
  state.Advance(true, 2);  // an overflow restarts the clean run
  EXPECT_EQ(state.scale, 2);
  EXPECT_EQ(state.clean_iterations, 0);
  state.Advance(false, 2);
  state.Advance(false, 2);
  EXPECT_EQ(state.scale, 4);
  EXPECT_EQ(state.clean_iterations, 0);
  EXPECT_EQ(state.skipped_iterations, 2);
}

TEST(LossScaleTest, StaysWithinItsBoundsAndOffWithoutScaling) {
  LossScaleState low{kMinLossScale, 0, 0};
  low.Advance(true, 1);
  EXPECT_EQ(low.scale, kMinLossScale);
  LossScaleState high{kMaxLossScale, 0, 0};
  high.Advance(false, 1);
  EXPECT_EQ(high.scale, kMaxLossScale);
  LossScaleState off = LossScaleState::Initial(LossScaleOptions{});
  EXPECT_EQ(off.scale, 0);
  off.Advance(true, 1);
  EXPECT_EQ(off.scale, 0);
  EXPECT_EQ(off.skipped_iterations, 0);
}

}  // namespace
}  // namespace ps
