#include "server/optimizer.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace ps::server {
namespace {

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

TEST(LrScheduleTest, ParsesItsUnit) {
  EXPECT_EQ(*ParseLrScheduleUnit("epochs"), LrSchedule::Unit::kEpochs);
  EXPECT_EQ(*ParseLrScheduleUnit("steps"), LrSchedule::Unit::kSteps);
  EXPECT_EQ(ParseLrScheduleUnit("days").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SgdOptimizerTest, MatchesPytorchFormulaOverSteps) {
  CpuDevice device(0, 1);
  OptimizerOptions options;
  options.sgd.lr = 0.1f;
  options.sgd.momentum = 0.9f;
  options.sgd.weight_decay = 0.01f;
  auto opt = SgdOptimizer::Create(options, 2, &device);
  ASSERT_TRUE(opt.ok()) << opt.status();
  std::vector<float> p = {1.f, -2.f};
  std::vector<double> ref_p = {1.0, -2.0}, buf = {0, 0};
  const std::vector<float> grad_sum = {4.f, 8.f};  // over 4 samples
  for (int step = 0; step < 3; ++step) {
    ASSERT_TRUE((*opt)->Apply(step, 4, grad_sum, absl::MakeSpan(p)).ok());
    for (int i = 0; i < 2; ++i) {
      const double g = grad_sum[i] / 4.0 + 0.01 * ref_p[i];
      buf[i] = 0.9 * buf[i] + g;
      ref_p[i] -= 0.1 * buf[i];
    }
  }
  EXPECT_NEAR(p[0], ref_p[0], 1e-6);
  EXPECT_NEAR(p[1], ref_p[1], 1e-6);
}

TEST(SgdOptimizerTest, RejectsBadOptionsAndSizes) {
  CpuDevice device(0, 1);
  OptimizerOptions bad;
  bad.sgd.momentum = 1.5f;
  EXPECT_EQ(SgdOptimizer::Create(bad, 1, &device).status().code(),
            absl::StatusCode::kInvalidArgument);
  bad = OptimizerOptions();
  bad.sgd.lr = NAN;
  EXPECT_EQ(SgdOptimizer::Create(bad, 1, &device).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto opt = SgdOptimizer::Create(OptimizerOptions(), 2, &device);
  ASSERT_TRUE(opt.ok());
  std::vector<float> p = {1, 2}, g = {1};
  EXPECT_EQ((*opt)->Apply(0, 1, g, absl::MakeSpan(p)).code(), absl::StatusCode::kInvalidArgument);
  std::vector<float> g2 = {1, 1};
  EXPECT_EQ((*opt)->Apply(0, 0, g2, absl::MakeSpan(p)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p, (std::vector<float>{1, 2}));
}

}  // namespace
}  // namespace ps::server
