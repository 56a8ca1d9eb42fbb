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

TEST(CheckCertificateNamesTest, TheIdMustBeTheCommonNameOrASubjectAltName) {
  EXPECT_TRUE(CheckCertificateNames("w0", {"w0"}, {"w0"}).ok());
  EXPECT_TRUE(CheckCertificateNames("w0", {"host-a"}, {"w0", "w0.ps"}).ok()) << "a SAN";
  EXPECT_TRUE(CheckCertificateNames("w0", {"w0"}, {}).ok()) << "the CN";
  // Another worker's certificate, and the server's.
  const absl::Status other = CheckCertificateNames("w0", {"w1"}, {"w1"});
  EXPECT_EQ(other.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(other.message(),
              HasSubstr("worker 'w0' must present a client certificate whose CN or "
                        "subjectAltName is its id; this one names CN 'w1', SAN 'w1'"));
  EXPECT_THAT(CheckCertificateNames("w0", {"server"}, {"localhost", "127.0.0.1", "server"})
                  .message(),
              HasSubstr("CN 'server', SAN 'localhost', SAN '127.0.0.1', SAN 'server'"));
  // Names are matched whole, and none is none.
  EXPECT_EQ(CheckCertificateNames("w0", {"w01"}, {"xw0"}).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(CheckCertificateNames("", {}, {}).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(CheckCertificateNames("w0", {}, {}).message(), HasSubstr("this one names nothing"));
  // A certificate with many names is quoted in part.
  const std::vector<std::string> many(20, std::string(100, 'n'));
  const absl::Status long_list = CheckCertificateNames("w0", {}, many);
  EXPECT_THAT(long_list.message(), HasSubstr("...' and 12 more"));
  EXPECT_LT(long_list.message().size(), 1024u);
}

}  // namespace
}  // namespace ps::server
