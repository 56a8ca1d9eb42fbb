#include "server/worker_loss/worker_loss_policy.h"

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::server {
namespace {

using ::testing::HasSubstr;
using Action = WorkerLossPolicy::Action;

constexpr int64_t kSecond = 1'000'000'000;

WorkerProgress Worker(const char* id, int64_t heard_ns) {
  WorkerProgress w;
  w.id = id;
  w.heard_ns = heard_ns;
  return w;
}

TEST(WorkerLossPolicyTest, ParsesItsNamesAndRefusesOthers) {
  auto wait = ParseWorkerLossPolicy("wait", absl::Seconds(5));
  ASSERT_TRUE(wait.ok()) << wait.status();
  EXPECT_EQ((*wait)->Name(), "wait");
  EXPECT_FALSE((*wait)->Shrinks());
  auto shrink = ParseWorkerLossPolicy("shrink", absl::Seconds(5));
  ASSERT_TRUE(shrink.ok()) << shrink.status();
  EXPECT_EQ((*shrink)->Name(), "shrink");
  EXPECT_TRUE((*shrink)->Shrinks());
  const absl::Status bad = ParseWorkerLossPolicy("drop", absl::Seconds(5)).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("--on_worker_loss=drop: use wait or shrink"));
}

TEST(WorkerLossPolicyTest, WaitFailsTheJobOnceTheTimeoutRunsOut) {
  auto wait = WaitForLostWorkers(absl::Seconds(10));
  const auto w = Worker("w1", 5 * kSecond);
  EXPECT_EQ(wait->OnLost(1, w, 7, 14 * kSecond), Action::kKeepWaiting);
  EXPECT_EQ(wait->OnLost(1, w, 7, 15 * kSecond - 1), Action::kKeepWaiting);
  EXPECT_EQ(wait->OnLost(1, w, 7, 15 * kSecond), Action::kFailJob);
  const absl::Status failure = wait->Failure(1, w, 7, 15 * kSecond + kSecond / 4);
  EXPECT_EQ(failure.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(failure.message(),
            "job failed: worker rank 1 ('w1') lost for 10.2s at iteration 7 "
            "(--on_worker_loss=wait, --worker_loss_timeout=10s)");
  // Never registered, or never heard from: late, not lost.
  EXPECT_EQ(wait->OnLost(1, Worker("", -1), 7, 100 * kSecond), Action::kKeepWaiting);
  EXPECT_EQ(wait->OnLost(1, Worker("w1", -1), 7, 100 * kSecond), Action::kKeepWaiting);
}

TEST(WorkerLossPolicyTest, ShrinkDropsRegisteredWorkersAtOnce) {
  auto shrink = ShrinkOnWorkerLoss();
  EXPECT_EQ(shrink->OnLost(0, Worker("w0", 0), 3, 0), Action::kDrop);
  EXPECT_EQ(shrink->OnLost(0, Worker("", -1), 3, 0), Action::kKeepWaiting);
}

TEST(WorkerLossPolicyTest, ShrinkIsRefusedWhereTheConsistencyCannotShrink) {
  auto shrink = ShrinkOnWorkerLoss();
  EXPECT_TRUE(shrink->CheckConsistency(*SyncConsistency()).ok());
  EXPECT_TRUE(shrink->CheckConsistency(*SspConsistency(0).value()).ok());
  const absl::Status ssp = shrink->CheckConsistency(*SspConsistency(2).value());
  EXPECT_EQ(ssp.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ssp.message(), HasSubstr("--on_worker_loss=shrink with --consistency=ssp:2 is not "
                                       "supported"));
  const absl::Status async = shrink->CheckConsistency(*AsyncConsistency());
  EXPECT_THAT(async.message(), HasSubstr("nothing to shrink"));
  // Waiting is defined under every policy.
  EXPECT_TRUE(WaitForLostWorkers(absl::Seconds(1))->CheckConsistency(*AsyncConsistency()).ok());
}

}  // namespace
}  // namespace ps::server
