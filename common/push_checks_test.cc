#include "common/push_checks.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

using ::testing::HasSubstr;

TEST(PushChecksTest, SamplesMustBeInRangeAndTheSameWithinAnIteration) {
  EXPECT_TRUE(CheckPushSamples(0).ok());
  EXPECT_TRUE(CheckPushSamples(kMaxSamplesPerPush).ok());
  EXPECT_THAT(CheckPushSamples(-1).message(), HasSubstr("claims -1 samples; 0 to"));
  EXPECT_EQ(CheckPushSamples(kMaxSamplesPerPush + 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckSameSamples(32, -1, "worker rank 1", 4).ok());
  EXPECT_TRUE(CheckSameSamples(32, 32, "worker rank 1", 4).ok());
  const absl::Status differs = CheckSameSamples(16, 32, "worker rank 1", 4);
  EXPECT_EQ(differs.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(differs.message(),
            "push claims 16 samples but worker rank 1 claimed 32 earlier in iteration 4");
}

TEST(PushChecksTest, ANonFiniteValueIsRefusedOrAnOverflowUnderLossScaling) {
  std::vector<float> values = {1.f, 2.f, std::numeric_limits<float>::quiet_NaN(), 4.f};
  const absl::string_view bytes(reinterpret_cast<const char*>(values.data()),
                                values.size() * sizeof(float));
  // Cut mid-element, as a received message's slices may be.
  const std::vector<absl::string_view> pieces = {bytes.substr(0, 9), bytes.substr(9)};
  auto refused = CheckGradientValues(pieces, 100, "conv1.weight", /*loss_scaling=*/false);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("element 102 of 'conv1.weight' is nan; refusing a non-finite value"));
  EXPECT_TRUE(*CheckGradientValues(pieces, 100, "conv1.weight", /*loss_scaling=*/true));
  values[2] = 3.f;
  EXPECT_FALSE(*CheckGradientValues(pieces, 0, "conv1.weight", /*loss_scaling=*/false));
}

}  // namespace
}  // namespace ps
