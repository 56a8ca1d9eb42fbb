// The optimizers' common part: the learning-rate schedule, the options'
// checks and the factory, and the checks every implementation shares.

#include "common/optimizer/optimizer.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

using ::testing::HasSubstr;

TEST(LrScheduleTest, StepDecay) {
  LrSchedule s;
  s.unit = LrSchedule::Unit::kSteps;
  s.step_size = 10;
  s.gamma = 0.5f;
  EXPECT_FLOAT_EQ(s.LearningRate(1.f, 0), 1.f);
  EXPECT_FLOAT_EQ(s.LearningRate(1.f, 9), 1.f);
  EXPECT_FLOAT_EQ(s.LearningRate(1.f, 10), 0.5f);
  EXPECT_FLOAT_EQ(s.LearningRate(1.f, 25), 0.25f);
  s.unit = LrSchedule::Unit::kEpochs;
  s.step_size = 2;
  s.steps_per_epoch = 100;
  EXPECT_FLOAT_EQ(s.LearningRate(1.f, 199), 1.f);
  EXPECT_FLOAT_EQ(s.LearningRate(1.f, 200), 0.5f);
  s.step_size = 0;
  EXPECT_FLOAT_EQ(s.LearningRate(0.3f, 1000), 0.3f);
}

// Linear warm-up, step by step, alone and on top of step decay; and the
// optimizer's updates use it.
TEST(LrScheduleTest, LinearWarmUpStepByStep) {
  LrSchedule s;
  s.warmup_steps = 4;
  const float expected[] = {0.2f, 0.4f, 0.6f, 0.8f, 0.8f, 0.8f};
  for (int64_t step = 0; step < 6; ++step) {
    EXPECT_FLOAT_EQ(s.LearningRate(0.8f, step), expected[step]) << step;
  }
  s.unit = LrSchedule::Unit::kSteps;
  s.step_size = 2;
  s.gamma = 0.5f;
  const float decayed[] = {0.2f, 0.4f, 0.3f, 0.4f, 0.2f, 0.2f};
  for (int64_t step = 0; step < 6; ++step) {
    EXPECT_FLOAT_EQ(s.LearningRate(0.8f, step), decayed[step]) << step;
  }

  OptimizerOptions options;
  options.sgd.lr = 0.8f;
  options.schedule.warmup_steps = 4;
  CpuDevice device(0, 1);
  auto optimizer = CreateOptimizer(options, 1, &device);
  ASSERT_TRUE(optimizer.ok());
  std::vector<float> param = {1.f};
  const std::vector<float> grad = {1.f};
  float want = 1.f;
  for (int64_t step = 0; step < 6; ++step) {
    ASSERT_TRUE((*optimizer)->Apply(step, 1, grad, absl::MakeSpan(param)).ok());
    want -= expected[step];
    EXPECT_FLOAT_EQ(param[0], want) << step;
  }
  options.schedule.warmup_steps = -1;
  EXPECT_EQ(ValidateOptimizerOptions(options).code(), absl::StatusCode::kInvalidArgument);
}

TEST(LrScheduleTest, ParsesItsUnit) {
  EXPECT_EQ(*ParseLrScheduleUnit("epochs"), LrSchedule::Unit::kEpochs);
  EXPECT_EQ(*ParseLrScheduleUnit("steps"), LrSchedule::Unit::kSteps);
  EXPECT_EQ(ParseLrScheduleUnit("days").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CreateOptimizerTest, MakesTheKindItIsAskedFor) {
  CpuDevice device(0, 1);
  auto sgd = CreateOptimizer(OptimizerOptions(), 3, &device);
  ASSERT_TRUE(sgd.ok()) << sgd.status();
  EXPECT_EQ((*sgd)->name(), "sgd");
  EXPECT_EQ((*sgd)->output(), Optimizer::Output::kParameters);
  OptimizerOptions none;
  none.kind = kMeanGradientOptimizer;
  auto mean = CreateOptimizer(none, 3, &device);
  ASSERT_TRUE(mean.ok()) << mean.status();
  EXPECT_EQ((*mean)->name(), "none");
  EXPECT_EQ((*mean)->output(), Optimizer::Output::kMeanGradient);
  EXPECT_TRUE((*mean)->momentum().empty());
}

TEST(CreateOptimizerTest, RefusesAnUnknownKindNamingTheChoices) {
  CpuDevice device(0, 1);
  OptimizerOptions options;
  options.kind = "adam";
  const absl::Status s = CreateOptimizer(options, 3, &device).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("optimizer 'adam': use sgd or none"));
  EXPECT_EQ(CreateOptimizer(OptimizerOptions(), -1, &device).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// "none" takes no SGD setting: one given is refused by name, not ignored.
// steps_per_epoch is the caller's to set (the server's registrations).
TEST(CreateOptimizerTest, MeanGradientRefusesSgdSettings) {
  OptimizerOptions none;
  none.kind = kMeanGradientOptimizer;
  none.schedule.steps_per_epoch = 469;
  EXPECT_TRUE(ValidateOptimizerOptions(none).ok());
  none.sgd.lr = 0.5f;
  none.sgd.momentum = 0.9f;
  none.schedule.warmup_steps = 10;
  const absl::Status s = ValidateOptimizerOptions(none);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("publishes the mean gradient"));
  EXPECT_THAT(s.message(), HasSubstr("lr, momentum, warmup_steps"));
}

// Every kind refuses the same bad calls with the same codes, writing
// nothing.
TEST(CreateOptimizerTest, EveryKindMakesTheSameChecks) {
  CpuDevice device(0, 1);
  for (const char* kind : {kSgdOptimizer, kMeanGradientOptimizer}) {
    SCOPED_TRACE(kind);
    OptimizerOptions options;
    options.kind = kind;
    auto created = CreateOptimizer(options, 4, &device);
    ASSERT_TRUE(created.ok()) << created.status();
    Optimizer& opt = **created;
    std::vector<float> p = {1, 2}, out = {7, 7}, g = {1, 1}, g3 = {1, 1, 1};
    const std::string two(8, '\0'), three(12, '\0');
    const absl::string_view piece2[] = {two}, piece3[] = {three};
    for (int64_t offset : {int64_t{-1}, int64_t{3}, INT64_MAX}) {
      EXPECT_EQ(opt.ApplyRange(0, 1, offset, g, p, absl::MakeSpan(out)).code(),
                absl::StatusCode::kInvalidArgument)
          << offset;
    }
    EXPECT_EQ(opt.ApplyRange(0, 1, 0, g3, p, absl::MakeSpan(out)).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(opt.ApplyRange(0, 0, 0, g, p, absl::MakeSpan(out)).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(opt.ApplyRangeAdding(0, 1, 0, g, piece3, p, absl::MakeSpan(out)).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(opt.ApplyRangeAdding(0, 1, 0, g3, piece2, p, absl::MakeSpan(out)).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(opt.Apply(0, 1, g, absl::MakeSpan(p)).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(out, (std::vector<float>{7, 7}));
    EXPECT_EQ(p, (std::vector<float>{1, 2}));
    EXPECT_TRUE(opt.ApplyRange(0, 1, 2, g, p, absl::MakeSpan(out)).ok());
  }
}

}  // namespace
}  // namespace ps
