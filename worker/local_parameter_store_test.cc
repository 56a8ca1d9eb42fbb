#include "worker/local_parameter_store.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::worker {
namespace {

std::vector<ParamSpec> Signature() {
  return {{"fc.weight", {2, 2}, DType::kF32}, {"fc.bias", {2}, DType::kF32}};
}

TEST(LocalParameterStoreTest, StartsFromTheProposalAndAppliesSgd) {
  server::OptimizerOptions sgd;
  sgd.sgd.lr = 0.5f;
  auto store = LocalParameterStore::Create(sgd);
  ASSERT_TRUE(store.ok()) << store.status();
  const std::vector<float> proposal = {1, 2, 3, 4, 5, 6};
  auto reg = (*store)->Register(Signature(), proposal);
  ASSERT_TRUE(reg.ok()) << reg.status();
  EXPECT_EQ(reg->rank, 0);
  EXPECT_EQ(reg->num_workers, 1);
  EXPECT_EQ(reg->version, 0);
  std::vector<float> params(6);
  ASSERT_TRUE((*store)->Pull(0, absl::MakeSpan(params)).ok());
  EXPECT_EQ(params, proposal);

  // A gradient summed over 2 samples: the step is lr * grad / 2.
  ASSERT_TRUE((*store)->Push(0, 2, std::vector<float>{2, 2, 2, 2, 4, 4}).ok());
  ASSERT_TRUE((*store)->WaitForVersion(1).ok());
  auto version = (*store)->Pull(1, absl::MakeSpan(params));
  ASSERT_TRUE(version.ok());
  EXPECT_EQ(*version, 1);
  EXPECT_EQ(params, (std::vector<float>{0.5f, 1.5f, 2.5f, 3.5f, 4, 5}));
}

// One segment per tensor, each done inside its call: a tensor's new value
// can be pulled as soon as its push returns, before the other is pushed.
TEST(LocalParameterStoreTest, SegmentsAreTensorsPublishedAsSoonAsPushed) {
  server::OptimizerOptions sgd;
  sgd.sgd.lr = 0.5f;
  auto store = LocalParameterStore::Create(sgd);
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->Register(Signature(), {1, 2, 3, 4, 5, 6}).ok());
  EXPECT_EQ((*store)->SegmentEnds(), (std::vector<int64_t>{4, 6}));
  const std::vector<float> grad = {2, 2, 2, 2, 4, 4};
  std::vector<float> params(6, -1);
  absl::Status status = absl::UnknownError("not run");
  auto record = [&](absl::Status s) { status = std::move(s); };
  (*store)->PushSegments(0, 2, 1, 2, grad, record);  // fc.bias first
  ASSERT_TRUE(status.ok()) << status;
  (*store)->PullSegments(1, 1, 2, absl::MakeSpan(params), record);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(params, (std::vector<float>{-1, -1, -1, -1, 4, 5}));
  // fc.weight is still at version 0: its pull of version 1 cannot wait.
  (*store)->PullSegments(1, 0, 1, absl::MakeSpan(params), record);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  (*store)->PushSegments(0, 2, 0, 1, grad, record);
  ASSERT_TRUE(status.ok()) << status;
  (*store)->PullSegments(1, 0, 1, absl::MakeSpan(params), record);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(params, (std::vector<float>{0.5f, 1.5f, 2.5f, 3.5f, 4, 5}));
  (*store)->PushSegments(1, 2, 0, 3, grad, record);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
}

TEST(LocalParameterStoreTest, RefusesWhatWouldNeverComplete) {
  auto store = LocalParameterStore::Create(server::OptimizerOptions());
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->Register(Signature(), {1, 2, 3, 4, 5, 6}).ok());
  // With one worker, a version beyond the next one never comes.
  EXPECT_EQ((*store)->WaitForVersion(2).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*store)->Push(0, 1, std::vector<float>(4)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*store)->Push(3, 1, std::vector<float>(6)).code(),
            absl::StatusCode::kFailedPrecondition);
  std::vector<float> with_nan = {0, 0, 0, 0, 0, NAN};
  EXPECT_EQ((*store)->Push(0, 1, with_nan).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*store)->server().version(), 0);  // nothing applied
}

TEST(LocalParameterStoreTest, ProposalOfTheWrongSizeIsRefused) {
  auto store = LocalParameterStore::Create(server::OptimizerOptions());
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->Register(Signature(), {1, 2, 3}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LocalParameterStoreTest, EpochScheduleUsesTheStatedStepsPerEpoch) {
  server::OptimizerOptions sgd;
  sgd.sgd.lr = 1.f;
  sgd.schedule.unit = server::LrSchedule::Unit::kEpochs;
  sgd.schedule.step_size = 1;
  sgd.schedule.gamma = 0.5f;
  sgd.schedule.steps_per_epoch = 2;
  auto store = LocalParameterStore::Create(sgd);
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->Register(Signature(), std::vector<float>(6, 0.f)).ok());
  std::vector<float> params(6);
  for (int64_t it = 0; it < 3; ++it) {
    ASSERT_TRUE((*store)->Push(it, 1, std::vector<float>(6, 1.f)).ok());
  }
  ASSERT_TRUE((*store)->Pull(3, absl::MakeSpan(params)).ok());
  EXPECT_FLOAT_EQ(params[0], -2.5f);  // 1 + 1 in epoch 0, 0.5 in epoch 1
}

}  // namespace
}  // namespace ps::worker
