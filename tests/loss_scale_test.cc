// Dynamic loss scaling end to end: two workers (the trainer, the remote
// store and its pipeline) against a real gRPC server in this process that
// decides the scale. An overflow injected on one worker skips that step on
// both (the parameters are those of a run that stopped before it), halves
// the scale, and leaves only finite values; scaling the loss of an fp32
// model by a power of two changes no bit; fp16 GEMMs train under it.

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cpu_device.h"
#include "gtest/gtest.h"
#include "tests/in_process_job.h"
#include "worker/data/synthetic.h"
#include "worker/remote_parameter_store.h"
#include "worker/trainer.h"

namespace ps {
namespace {

constexpr int64_t kGlobalBatch = 30;

struct Job {
  bool loss_scaling = true;
  float initial_scale = 1024.f;
  int64_t growth_interval = 3;
  int64_t steps = 6;
  Precision precision = Precision::kFp32;
  int64_t inject_on_rank_1_at = -1;  // TrainerOptions::inject_overflow_at_iteration
};

struct Outcome {
  std::vector<std::vector<float>> worker_params;  // by rank
  std::vector<float> server_params;
  std::vector<int64_t> overflow_steps;  // by rank
  server::ParameterServer::LossScale scale;
  std::vector<double> final_loss;  // by rank
};

Outcome Train(const Job& r) {
  worker::data::SyntheticOptions data_options;
  data_options.size = 210;  // 7 steps per epoch
  auto data = worker::data::MakeSyntheticDataset(data_options);
  if (!data.ok()) {
    ADD_FAILURE() << data.status();
    return {};
  }
  testing::InProcessJob job;
  job.server.num_workers = 2;
  job.server.optimizer.sgd.lr = 0.05f;
  job.server.optimizer.sgd.momentum = 0.9f;
  job.server.optimizer.sgd.weight_decay = 5e-4f;
  job.server.chunk_elements = 1000;  // several messages
  job.server.loss_scale.dynamic = r.loss_scaling;
  job.server.loss_scale.initial = r.initial_scale;
  job.server.loss_scale.growth_interval = r.growth_interval;
  job.steps = r.steps;
  job.trainer.batch_size = kGlobalBatch;
  job.trainer.precision = r.precision;
  job.configure = [&](int rank, worker::TrainerOptions* options) {
    if (rank == 1) options->inject_overflow_at_iteration = r.inject_on_rank_1_at;
  };
  const testing::JobOutcome got = testing::RunInProcessJob(job, *data);
  Outcome out;
  for (const testing::WorkerOutcome& w : got.workers) {
    EXPECT_EQ(w.registered_loss_scale, r.loss_scaling ? r.initial_scale : 0.f);
    out.worker_params.push_back(w.params);
    out.overflow_steps.push_back(w.overflow_steps);
    out.final_loss.push_back(w.report.epochs.empty() ? 0 : w.report.epochs.back().train_loss);
  }
  EXPECT_EQ(got.server_version, r.steps);
  out.scale = got.loss_scale;
  out.server_params = got.server_params;
  return out;
}

bool BitIdentical(const std::vector<float>& a, const std::vector<float>& b) {
  return !a.empty() && a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

bool AllFinite(const std::vector<float>& v) {
  for (float x : v) {
    if (!std::isfinite(x)) return false;
  }
  return true;
}

// The core promise survives loss scaling: the scaled gradients, divided by
// the same power of two on the server, give fp32 training bit for bit.
TEST(LossScaleTest, ScalingAnFp32ModelChangesNoBit) {
  Job plain;
  plain.loss_scaling = false;
  Job scaled;
  scaled.initial_scale = 4096.f;
  scaled.growth_interval = 2;  // the scale changes during the run too
  const Outcome a = Train(plain), b = Train(scaled);
  EXPECT_TRUE(BitIdentical(a.server_params, b.server_params));
  EXPECT_EQ(b.scale.skipped_iterations, 0);
  EXPECT_EQ(b.scale.scale, 4096.f * 8);  // doubled after iterations 1, 3 and 5
}

// An infinity on rank 1 at iteration 3: both workers skip step 3 (the
// parameters are those of a run of 3 steps), the scale halves, and every
// worker holds the server's finite parameters.
TEST(LossScaleTest, AnOverflowOnOneWorkerSkipsTheStepOnEveryWorker) {
  Job injected;
  injected.steps = 4;
  injected.inject_on_rank_1_at = 3;
  Job shorter;
  shorter.steps = 3;
  const Outcome a = Train(injected), b = Train(shorter);
  EXPECT_TRUE(BitIdentical(a.server_params, b.server_params));
  EXPECT_TRUE(AllFinite(a.server_params));
  for (int w = 0; w < 2; ++w) {
    EXPECT_TRUE(BitIdentical(a.worker_params[w], a.server_params)) << "worker " << w;
  }
  EXPECT_EQ(a.overflow_steps[0], 0);
  EXPECT_EQ(a.overflow_steps[1], 1);
  EXPECT_EQ(a.scale.skipped_iterations, 1);
  // 1024 doubled after 3 clean iterations (0-2), halved by iteration 3.
  EXPECT_EQ(b.scale.scale, 2048.f);
  EXPECT_EQ(a.scale.scale, 1024.f);
}

// fp16 GEMMs under dynamic loss scaling train as fp32 does, and end with
// finite parameters that both workers share; the scale grows while no step
// overflows.
TEST(LossScaleTest, Fp16TrainsUnderDynamicLossScaling) {
  Job fp16;
  fp16.precision = Precision::kFp16;
  fp16.initial_scale = 1024.f;
  fp16.growth_interval = 4;
  fp16.steps = 14;
  Job fp32 = fp16;
  fp32.precision = Precision::kFp32;
  const Outcome a = Train(fp16), b = Train(fp32);
  EXPECT_TRUE(AllFinite(a.server_params));
  for (int w = 0; w < 2; ++w) {
    EXPECT_TRUE(BitIdentical(a.worker_params[w], a.server_params)) << "worker " << w;
  }
  EXPECT_EQ(a.scale.skipped_iterations, 0);
  EXPECT_EQ(a.scale.scale, 1024.f * 8);  // doubled after iterations 3, 7 and 11
  // fp16 rounding moves the parameters, but not far (measured: 2.7% apart
  // after 14 steps of momentum 0.9, train loss 2.2% apart; bounds at 2x).
  EXPECT_FALSE(BitIdentical(a.server_params, b.server_params));
  double diff = 0, norm = 0;
  for (size_t i = 0; i < b.server_params.size(); ++i) {
    diff += std::pow(a.server_params[i] - b.server_params[i], 2);
    norm += std::pow(b.server_params[i], 2);
  }
  EXPECT_LT(std::sqrt(diff / norm), 0.055) << "relative distance from fp32's parameters";
  EXPECT_NEAR(a.final_loss[0], b.final_loss[0], 0.045 * b.final_loss[0]);
}

}  // namespace
}  // namespace ps
