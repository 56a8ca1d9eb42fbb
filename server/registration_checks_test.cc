#include "server/registration_checks.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::server {
namespace {

using ::testing::HasSubstr;

TEST(SignatureDifferenceTest, NamesTheFirstDifference) {
  const std::vector<ParamSpec> job = {{"w", {2, 3}, DType::kF32}, {"b", {2}, DType::kF32}};
  EXPECT_EQ(SignatureDifference(job, job), "");
  auto other = job;
  other[1].shape = {3};
  EXPECT_EQ(SignatureDifference(job, other),
            "parameter 'b' has shape [2] on the server but [3] on the worker");
  other = job;
  other[0].name = "v";
  EXPECT_EQ(SignatureDifference(job, other), "parameter 0 is 'w' on the server but 'v' on the worker");
  other = job;
  other[0].dtype = DType::kF16;
  EXPECT_THAT(SignatureDifference(job, other), HasSubstr("has dtype"));
  other = job;
  other.pop_back();
  EXPECT_EQ(SignatureDifference(job, other), "the server's model has 2 parameters, the worker's 1");
}

TEST(CheckRegistrantTest, NamesTheWorkerAndWhatIsWrong) {
  const std::vector<ParamSpec> job = {{"w", {2, 3}, DType::kF32}};
  EXPECT_TRUE(CheckRegistrant("w0", -1, 2, nullptr, job).ok());
  EXPECT_TRUE(CheckRegistrant("w0", 1, 2, &job, job).ok());
  EXPECT_EQ(CheckRegistrant("", -1, 2, &job, job).message(), "worker id is empty");
  EXPECT_EQ(CheckRegistrant("w0", 2, 2, &job, job).message(),
            "worker 'w0' asks for rank 2 but the job has 2 workers");
  EXPECT_EQ(CheckRegistrant("w0", -1, 2, nullptr, {}).code(), absl::StatusCode::kInvalidArgument);
  auto other = job;
  other[0].shape = {3, 2};
  const absl::Status different = CheckRegistrant("w1", -1, 2, &job, other);
  EXPECT_EQ(different.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(different.message(), HasSubstr("worker 'w1' has a different model: parameter 'w'"));
}

TEST(CheckStepsPerEpochTest, EveryWorkerStatesTheJobsEpoch) {
  LrSchedule steps;
  steps.unit = LrSchedule::Unit::kSteps;
  EXPECT_TRUE(CheckStepsPerEpoch("w0", 0, -1, steps).ok());
  EXPECT_TRUE(CheckStepsPerEpoch("w1", 235, 235, steps).ok());
  EXPECT_EQ(CheckStepsPerEpoch("w1", -1, -1, steps).code(), absl::StatusCode::kInvalidArgument);
  const absl::Status differs = CheckStepsPerEpoch("w1", 234, 235, steps);
  EXPECT_EQ(differs.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(differs.message(), HasSubstr("has 234 steps per epoch but the job has 235"));
  LrSchedule epochs;
  epochs.unit = LrSchedule::Unit::kEpochs;
  epochs.step_size = 3;
  EXPECT_THAT(CheckStepsPerEpoch("w0", 0, -1, epochs).message(),
              HasSubstr("decays every 3 epochs, but worker 'w0' states no steps per epoch"));
}

TEST(ChooseRankTest, ARestartKeepsItsRankAndNewcomersTakeTheLowestFree) {
  const std::vector<std::string> holders = {"a", "", "c", ""};
  EXPECT_EQ(*ChooseRank(holders, "c", -1), 2) << "a restarted worker";
  EXPECT_EQ(*ChooseRank(holders, "c", 2), 2);
  EXPECT_EQ(*ChooseRank(holders, "d", -1), 1);
  EXPECT_EQ(*ChooseRank(holders, "d", 3), 3);
  EXPECT_THAT(ChooseRank(holders, "c", 1).status().message(),
              HasSubstr("worker 'c' holds rank 2 and cannot move to rank 1"));
  EXPECT_THAT(ChooseRank(holders, "d", 0).status().message(),
              HasSubstr("rank 0 is already held by worker 'a'"));
  const absl::Status full = ChooseRank({"a", "b"}, "c", -1).status();
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(full.message(), HasSubstr("all 2 worker slots are registered"));
}

}  // namespace
}  // namespace ps::server
