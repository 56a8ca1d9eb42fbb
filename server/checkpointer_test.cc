#include "server/checkpointer.h"

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace ps::server {
namespace {

std::vector<ParamSpec> Signature() { return {{"w", {3}, DType::kF32}}; }

class CheckpointerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ParameterServerOptions options;
    options.num_workers = 1;
    options.optimizer.sgd.lr = 0.5f;
    options.optimizer.sgd.momentum = 0.9f;
    auto server = ParameterServer::Create(options, Signature(), {1, 2, 3}, &device_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(server).value();
    ASSERT_TRUE(server_->Register("w", Signature(), 0, 4).ok());
    dir_ = absl::StrCat(testing::TempDir(), "/", testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void Step(int64_t it) {
    ASSERT_TRUE(server_->Push(0, it, 0, 0, 1, std::vector<float>{0.1f, 0.2f, 0.3f}).ok());
  }

  CpuDevice device_{0, 1};
  std::unique_ptr<ParameterServer> server_;
  std::string dir_;
};

TEST_F(CheckpointerTest, WritesEveryNStepsInTheBackgroundAndAFinalOne) {
  CheckpointerOptions options;
  options.files.directory = dir_;
  options.files.keep = 10;
  options.every_steps = 2;
  options.job = {{"num_workers", "1"}};
  Checkpointer checkpointer(server_.get(), options, -1);
  for (int64_t it = 0; it < 4; ++it) Step(it);
  // The background thread catches up with version 4 (2 and/or 4 written).
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  while (checkpointer.last_version() < 4 && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(checkpointer.last_version(), 4);
  Step(4);
  ASSERT_TRUE(checkpointer.WriteFinal(absl::Now() + absl::Seconds(5)).ok());
  EXPECT_EQ(checkpointer.last_version(), 5);
  auto loaded = LoadNewestCheckpoint(dir_, nullptr);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->contents.version, 5);
  EXPECT_EQ(loaded->contents.steps_per_epoch, 4);
  EXPECT_EQ(loaded->contents.job.at("num_workers"), "1");
  EXPECT_EQ(loaded->contents.momentum.size(), 3u);
  std::vector<float> params(3);
  ASSERT_TRUE(server_->Pull(5, absl::InfiniteFuture(), absl::MakeSpan(params)).ok());
  EXPECT_EQ(loaded->contents.parameters, params);
}

// A write that fails (here at once: the directory's parent is a file) is
// tried again at the next due point, not in a loop: one failure per
// multiple of every_steps the server reaches.
TEST_F(CheckpointerTest, AFailedWriteIsTriedAgainWhenTheNextIsDueNotAtOnce) {
  const std::string file = absl::StrCat(dir_, "-a-file");
  FILE* f = std::fopen(file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  CheckpointerOptions options;
  options.files.directory = absl::StrCat(file, "/checkpoints");
  options.every_steps = 1;
  absl::Mutex mu;
  int failures = 0;
  options.log = [&](const std::string& line) {
    absl::MutexLock lock(&mu);
    if (line.find("failed") != std::string::npos) ++failures;
  };
  {
    Checkpointer checkpointer(server_.get(), options, -1);
    Step(0);
    Step(1);
    absl::SleepFor(absl::Milliseconds(1500));
  }
  absl::MutexLock lock(&mu);
  EXPECT_GE(failures, 1);
  EXPECT_LE(failures, 2) << "versions 1 and 2 due, each tried once";
}

TEST_F(CheckpointerTest, NoFinalCheckpointOfAHalfAppliedIteration) {
  // Two chunks: one applied, one not, when the deadline comes.
  ParameterServerOptions options;
  options.num_workers = 1;
  options.chunk_elements = 2;
  options.optimizer.sgd.lr = 0.5f;
  auto server = ParameterServer::Create(options, Signature(), {1, 2, 3}, &device_);
  ASSERT_TRUE(server.ok());
  ASSERT_TRUE((*server)->Register("w", Signature(), 0).ok());
  ASSERT_TRUE((*server)->Push(0, 0, 0, 0, 1, std::vector<float>{1, 1}).ok());
  CheckpointerOptions checkpoints;
  checkpoints.files.directory = dir_;
  Checkpointer checkpointer(server->get(), checkpoints, -1);
  EXPECT_EQ(checkpointer.WriteFinal(absl::Now() + absl::Milliseconds(300)).code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(LoadNewestCheckpoint(dir_, nullptr).status().code(), absl::StatusCode::kNotFound);
}

TEST(JobSettingsTest, DifferencesNameTheSetting) {
  ParameterServerOptions a;
  a.num_workers = 2;
  a.optimizer.sgd.lr = 0.9f;
  ParameterServerOptions b = a;
  b.optimizer.sgd.lr = 0.5f;
  ParameterServerOptions c = a;
  c.num_workers = 3;
  ParameterServerOptions d = a;
  d.consistency = AsyncConsistency();
  EXPECT_EQ(JobDifferences(JobSettings(a), JobSettings(a)), "");
  EXPECT_EQ(JobDifferences(JobSettings(a), JobSettings(b)), "lr 0.9 in the checkpoint, 0.5 now");
  EXPECT_NE(JobDifferences(JobSettings(a), JobSettings(c)).find("num_workers 2"), std::string::npos);
  EXPECT_EQ(JobDifferences(JobSettings(a), JobSettings(d)),
            "consistency sync in the checkpoint, async now");
  ParameterServerOptions e = a;
  e.consistency = ParseConsistency("ssp:2").value();
  EXPECT_EQ(JobDifferences(JobSettings(a), JobSettings(e)),
            "consistency sync in the checkpoint, ssp:2 now");
  ParameterServerOptions f = a;
  f.optimizer.schedule.warmup_steps = 100;
  EXPECT_EQ(JobDifferences(JobSettings(a), JobSettings(f)),
            "lr_warmup_steps 0 in the checkpoint, 100 now");
  // Learning rates that differ in the 7th digit are two jobs.
  ParameterServerOptions g = a, h = a;
  g.optimizer.sgd.lr = 0.1234567f;
  h.optimizer.sgd.lr = 0.1234568f;
  EXPECT_EQ(JobDifferences(JobSettings(g), JobSettings(h)),
            "lr 0.1234567 in the checkpoint, 0.1234568 now");
  // A setting only the checkpoint has is a difference too.
  ParameterServerOptions scaled = a;
  scaled.loss_scale.dynamic = true;
  EXPECT_EQ(JobDifferences(JobSettings(scaled), JobSettings(a)),
            "loss_scale dynamic initial 65536 growth 2000 in the checkpoint, (none) now");
  // A checkpoint's value written with fewer digits is the same float.
  std::map<std::string, std::string> older = JobSettings(a);
  older["lr"] = "0.900000";
  EXPECT_EQ(JobDifferences(older, JobSettings(a)), "");
}

}  // namespace
}  // namespace ps::server
