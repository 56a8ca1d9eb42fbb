#include "server/call_admission.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::server {
namespace {

using ::testing::HasSubstr;

TEST(CallAdmissionTest, WithoutATokenEveryCallIsAdmittedUntilTheServerStops) {
  CallAdmission admission("");
  EXPECT_TRUE(admission.Admit("").ok());
  EXPECT_TRUE(admission.Admit("anything").ok());
  admission.Stop("received Terminated");
  admission.Stop("a later reason");
  const absl::Status stopped = admission.Admit("");
  EXPECT_EQ(stopped.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(stopped.message(), "server shutting down: received Terminated");
}

TEST(CallAdmissionTest, TheJobTokenIsRequiredAndCompared) {
  CallAdmission admission("s3cret-token");
  EXPECT_TRUE(admission.Admit("s3cret-token").ok());
  const absl::Status missing = admission.Admit("");
  EXPECT_EQ(missing.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(missing.message(), HasSubstr("needs the job token"));
  EXPECT_EQ(admission.Admit("s3cret-tokem").code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(admission.Admit("s3cret-token-and-more").code(), absl::StatusCode::kUnauthenticated);
}

TEST(CallAdmissionTest, AFailedJobRefusesEveryCallWithItsFirstFailure) {
  CallAdmission admission("");
  EXPECT_TRUE(admission.Fail(absl::FailedPreconditionError("job failed: rank 1 lost")));
  EXPECT_FALSE(admission.Fail(absl::FailedPreconditionError("another")));
  admission.Stop("the job failed");
  const absl::Status refused = admission.Admit("");
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.message(), "job failed: rank 1 lost");
}

}  // namespace
}  // namespace ps::server
