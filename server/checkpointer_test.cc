#include "server/checkpointer.h"
#include "server/parameter_server_testing.h"

#include <atomic>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "gtest/gtest.h"

namespace ps::server {
namespace {

std::vector<ParamSpec> Signature() { return {{"w", {3}, DType::kF32}}; }

// The checkpointer's log, counted: lines with " written to " and lines with
// " failed ", and a wait for a count (real time, a guard against a hang:
// the count awaited is what decides a test, never how long it took).
class LogLines {
 public:
  std::function<void(const std::string&)> Sink() {
    return [this](const std::string& line) {
      absl::MutexLock lock(&mu_);
      lines_.push_back(line);
    };
  }
  int written() const { return Count(" written to "); }
  int failed() const { return Count(" failed "); }
  bool AwaitWritten(int n) const { return Await(" written to ", n); }
  bool AwaitFailed(int n) const { return Await(" failed ", n); }
  std::vector<std::string> lines() const {
    absl::MutexLock lock(&mu_);
    return lines_;
  }

 private:
  int CountLocked(const std::string& word) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    int n = 0;
    for (const std::string& line : lines_) n += line.find(word) != std::string::npos ? 1 : 0;
    return n;
  }
  int Count(const std::string& word) const {
    absl::MutexLock lock(&mu_);
    return CountLocked(word);
  }
  bool Await(const std::string& word, int n) const {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return CountLocked(word) >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(30));
  }

  mutable absl::Mutex mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
};

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
    ASSERT_TRUE(Push(*server_, 0, it, 0, 0, 1, std::vector<float>{0.1f, 0.2f, 0.3f}).ok());
  }
  // Options writing every `every` of `clock`, by time alone, logging to
  // log_.
  CheckpointerOptions EveryOnClock(absl::Duration every, const Clock* clock) {
    CheckpointerOptions options;
    options.files.directory = dir_;
    options.files.keep = 10;
    options.every = every;
    options.clock = clock;
    options.log = log_.Sink();
    return options;
  }
  // A directory that cannot be made: its parent is a file.
  std::string UnwritableDirectory() {
    const std::string file = absl::StrCat(dir_, "-a-file");
    FILE* f = std::fopen(file.c_str(), "w");
    EXPECT_NE(f, nullptr);
    if (f != nullptr) std::fclose(f);
    return absl::StrCat(file, "/checkpoints");
  }
  // A server whose iterations are two chunks (w's elements 0-1 and 2), so
  // that an iteration can be left half applied.
  std::unique_ptr<ParameterServer> TwoChunkServer() {
    ParameterServerOptions options;
    options.num_workers = 1;
    options.chunk_elements = 2;
    options.optimizer.sgd.lr = 0.5f;
    auto server = ParameterServer::Create(options, Signature(), {1, 2, 3}, &device_);
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) return nullptr;
    EXPECT_TRUE((*server)->Register("w", Signature(), 0).ok());
    return std::move(server).value();
  }

  CpuDevice device_{0, 1};
  std::unique_ptr<ParameterServer> server_;
  std::string dir_;
  LogLines log_;
};

TEST_F(CheckpointerTest, WritesEveryNStepsInTheBackgroundAndAFinalOne) {
  CheckpointerOptions options;
  options.files.directory = dir_;
  options.files.keep = 10;
  options.every_steps = 2;
  options.job = {{"num_workers", "1"}};
  options.log = log_.Sink();
  Checkpointer checkpointer(server_.get(), options, -1);
  for (int64_t it = 0; it < 4; ++it) Step(it);
  // The background thread catches up with version 4 (2 and/or 4 written).
  for (int n = 1; checkpointer.last_version() < 4; ++n) ASSERT_TRUE(log_.AwaitWritten(n));
  EXPECT_EQ(checkpointer.last_version(), 4);
  Step(4);
  ASSERT_TRUE(checkpointer.WriteFinal(absl::Seconds(5)).ok());
  EXPECT_EQ(checkpointer.last_version(), 5);
  auto loaded = LoadNewestCheckpoint(dir_, nullptr);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->contents.version, 5);
  EXPECT_EQ(loaded->contents.steps_per_epoch, 4);
  EXPECT_EQ(loaded->contents.job.at("num_workers"), "1");
  EXPECT_EQ(loaded->contents.momentum.size(), 3u);
  std::vector<float> params(3);
  ASSERT_TRUE(Pull(*server_, 5, absl::InfiniteFuture(), absl::MakeSpan(params)).ok());
  EXPECT_EQ(loaded->contents.parameters, params);
}

// The job run is read at each write: none before the server learns it,
// then the one it learnt.
TEST_F(CheckpointerTest, RecordsTheJobRunOnceThereIsOne) {
  std::string run;
  CheckpointerOptions options;
  options.files.directory = dir_;
  options.job = {{"num_workers", "1"}};
  options.job_run = [&run] { return run; };
  Checkpointer checkpointer(server_.get(), options, -1);
  Step(0);
  ASSERT_TRUE(checkpointer.WriteFinal(absl::Seconds(5)).ok());
  EXPECT_EQ(LoadNewestCheckpoint(dir_, nullptr).value().contents.job.count(kJobRunSetting), 0u);
  run = "feedface01234567";
  Checkpointer later(server_.get(), options, 1);
  Step(1);
  ASSERT_TRUE(later.WriteFinal(absl::Seconds(5)).ok());
  EXPECT_EQ(LoadNewestCheckpoint(dir_, nullptr).value().contents.job.at(kJobRunSetting), run);
}

// By time: a checkpoint once `every` of the clock has passed since the last
// one, exactly then, and only of a version not yet written. Each
// WaitForWaiters returns once the background thread sleeps on the clock
// again, having done all it does at that reading.
TEST_F(CheckpointerTest, WritesEveryTenSecondsOfTheClockExactly) {
  FakeClock clock;
  Checkpointer checkpointer(server_.get(), EveryOnClock(absl::Seconds(10), &clock), -1);
  Step(0);  // version 1
  ASSERT_TRUE(clock.WaitForWaiters(1));
  clock.Advance(absl::Seconds(10) - absl::Milliseconds(1));
  ASSERT_TRUE(clock.WaitForWaiters(1));
  EXPECT_EQ(log_.written(), 0);
  EXPECT_EQ(checkpointer.last_version(), -1);
  EXPECT_EQ(checkpointer.time_since_last_write(), absl::Milliseconds(9999));

  clock.Advance(absl::Milliseconds(1));  // 10 s
  ASSERT_TRUE(clock.WaitForWaiters(1));
  EXPECT_EQ(log_.written(), 1);
  EXPECT_EQ(checkpointer.last_version(), 1);
  EXPECT_EQ(checkpointer.time_since_last_write(), absl::ZeroDuration());

  Step(1);  // version 2
  clock.Advance(absl::Seconds(10) - absl::Milliseconds(1));
  ASSERT_TRUE(clock.WaitForWaiters(1));
  EXPECT_EQ(log_.written(), 1);
  clock.Advance(absl::Milliseconds(1));  // 20 s
  ASSERT_TRUE(clock.WaitForWaiters(1));
  EXPECT_EQ(log_.written(), 2);
  EXPECT_EQ(checkpointer.last_version(), 2);

  // 30 s with nothing new: no checkpoint until the version moves, then one
  // at once, and the next 10 s after that.
  clock.Advance(absl::Seconds(10));
  Step(2);  // version 3
  ASSERT_TRUE(log_.AwaitWritten(3));
  ASSERT_TRUE(clock.WaitForWaiters(1));
  EXPECT_EQ(log_.written(), 3);
  EXPECT_EQ(checkpointer.last_version(), 3);
  EXPECT_EQ(checkpointer.time_since_last_write(), absl::ZeroDuration());
  auto loaded = LoadNewestCheckpoint(dir_, nullptr);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->contents.version, 3);
}

// A write that fails (here at once: the directory's parent is a file) is
// tried again at the next due point, not at once: one failure per 10 s of
// the clock in which the version moved.
TEST_F(CheckpointerTest, AFailedWriteIsTriedAgainTenSecondsLaterNotAtOnce) {
  FakeClock clock;
  CheckpointerOptions options = EveryOnClock(absl::Seconds(10), &clock);
  options.files.directory = UnwritableDirectory();
  Checkpointer checkpointer(server_.get(), options, -1);
  Step(0);  // version 1
  ASSERT_TRUE(clock.WaitForWaiters(1));
  clock.Advance(absl::Seconds(10));
  ASSERT_TRUE(clock.WaitForWaiters(1));  // failed, and asleep until 20 s
  EXPECT_EQ(log_.failed(), 1);
  clock.Advance(absl::Seconds(10) - absl::Nanoseconds(1));
  ASSERT_TRUE(clock.WaitForWaiters(1));
  EXPECT_EQ(log_.failed(), 1);
  // 20 s: due, but version 1 has been tried; version 2 is tried at once.
  clock.Advance(absl::Nanoseconds(1));
  Step(1);
  ASSERT_TRUE(log_.AwaitFailed(2));
  ASSERT_TRUE(clock.WaitForWaiters(1));
  EXPECT_EQ(log_.failed(), 2);
  EXPECT_EQ(log_.written(), 0);
  EXPECT_EQ(checkpointer.last_version(), -1);
  const std::vector<std::string> lines = log_.lines();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].rfind("checkpoint of version 1 failed", 0), 0u) << lines[0];
  EXPECT_EQ(lines[1].rfind("checkpoint of version 2 failed", 0), 0u) << lines[1];
}

// By steps: one failure per multiple of every_steps the server reaches,
// each version tried once.
TEST_F(CheckpointerTest, AFailedWriteIsTriedAgainAtTheNextStepNotAtOnce) {
  CheckpointerOptions options;
  options.files.directory = UnwritableDirectory();
  options.every_steps = 1;
  options.log = log_.Sink();
  {
    Checkpointer checkpointer(server_.get(), options, -1);
    Step(0);
    ASSERT_TRUE(log_.AwaitFailed(1));
    Step(1);
    ASSERT_TRUE(log_.AwaitFailed(2));
  }
  // Stopped: a version tried again at once would have failed again.
  const std::vector<std::string> lines = log_.lines();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].rfind("checkpoint of version 1 failed", 0), 0u) << lines[0];
  EXPECT_EQ(lines[1].rfind("checkpoint of version 2 failed", 0), 0u) << lines[1];
}

TEST_F(CheckpointerTest, NoFinalCheckpointOfAHalfAppliedIterationWhenTheTimeoutComes) {
  std::unique_ptr<ParameterServer> server = TwoChunkServer();
  ASSERT_NE(server, nullptr);
  // One chunk of iteration 0 applied, the other not.
  ASSERT_TRUE(Push(*server, 0, 0, 0, 0, 1, std::vector<float>{1, 1}).ok());
  FakeClock clock;
  Checkpointer checkpointer(server.get(), EveryOnClock(absl::ZeroDuration(), &clock), -1);
  std::atomic<bool> returned{false};
  absl::Status final_status;
  std::thread final_write([&] {
    final_status = checkpointer.WriteFinal(absl::Milliseconds(300));
    returned = true;
  });
  ASSERT_TRUE(clock.WaitForWaiters(1));
  clock.Advance(absl::Milliseconds(299));
  ASSERT_TRUE(clock.WaitForWaiters(1));
  EXPECT_FALSE(returned);
  clock.Advance(absl::Milliseconds(1));
  final_write.join();
  EXPECT_EQ(final_status.code(), absl::StatusCode::kDeadlineExceeded) << final_status;
  EXPECT_EQ(LoadNewestCheckpoint(dir_, nullptr).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CheckpointerTest, AFinalCheckpointWaitsForTheIterationToComplete) {
  std::unique_ptr<ParameterServer> server = TwoChunkServer();
  ASSERT_NE(server, nullptr);
  ASSERT_TRUE(Push(*server, 0, 0, 0, 0, 1, std::vector<float>{1, 1}).ok());
  FakeClock clock;
  Checkpointer checkpointer(server.get(), EveryOnClock(absl::ZeroDuration(), &clock), -1);
  absl::Status final_status;
  std::thread final_write([&] { final_status = checkpointer.WriteFinal(absl::Milliseconds(300)); });
  ASSERT_TRUE(clock.WaitForWaiters(1));
  clock.Advance(absl::Milliseconds(299));
  ASSERT_TRUE(clock.WaitForWaiters(1));
  ASSERT_TRUE(Push(*server, 0, 0, 0, 1, 1, std::vector<float>{1}).ok());  // completes it
  final_write.join();
  EXPECT_TRUE(final_status.ok()) << final_status;
  EXPECT_EQ(checkpointer.last_version(), 1);
  auto loaded = LoadNewestCheckpoint(dir_, nullptr);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->contents.version, 1);
}

// Stop gives up a background capture that waits for the iteration in
// progress to complete, without the clock moving (it would otherwise wait
// for good: the capture's deadline is never).
TEST_F(CheckpointerTest, StopGivesUpABackgroundCaptureAtOnce) {
  std::unique_ptr<ParameterServer> server = TwoChunkServer();
  ASSERT_NE(server, nullptr);
  ASSERT_TRUE(Push(*server, 0, 0, 0, 0, 1, std::vector<float>{1, 1}).ok());
  ASSERT_TRUE(Push(*server, 0, 0, 0, 1, 1, std::vector<float>{1}).ok());  // version 1
  ASSERT_TRUE(Push(*server, 0, 1, 0, 0, 1, std::vector<float>{1, 1}).ok());  // half of 1
  FakeClock clock;
  Checkpointer checkpointer(server.get(), EveryOnClock(absl::Seconds(10), &clock), -1);
  ASSERT_TRUE(clock.WaitForWaiters(1));
  clock.Advance(absl::Seconds(10));
  ASSERT_TRUE(clock.WaitForWaiters(1));  // the capture's wait
  checkpointer.Stop();
  EXPECT_EQ(log_.lines().size(), 0u);
  EXPECT_EQ(checkpointer.last_version(), -1);
  // The capture was withdrawn: completing the iteration writes nothing.
  ASSERT_TRUE(Push(*server, 0, 1, 0, 1, 1, std::vector<float>{1}).ok());
  EXPECT_EQ(server->version(), 2);
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
  // Written before the optimizer was recorded: sgd's.
  older.erase("optimizer");
  EXPECT_EQ(JobDifferences(older, JobSettings(a)), "");
}

// A sum-only server's checkpoint records its optimizer and no SGD setting;
// resuming it under the other optimizer is refused by that one difference.
// The job run says which run the state is of, not how the job trains: a
// checkpoint with one and a job without (the server learns it later) are
// the same job.
TEST(JobSettingsTest, TheJobRunIsNotASetting) {
  ParameterServerOptions a;
  a.num_workers = 2;
  std::map<std::string, std::string> saved = JobSettings(a);
  saved[kJobRunSetting] = "0123456789abcdef";
  EXPECT_EQ(JobDifferences(saved, JobSettings(a)), "");
}

TEST(JobSettingsTest, AnotherOptimizerIsTheOneDifference) {
  ParameterServerOptions sgd;
  sgd.num_workers = 2;
  ParameterServerOptions none = sgd;
  none.optimizer.kind = kMeanGradientOptimizer;
  const std::map<std::string, std::string> settings = JobSettings(none);
  EXPECT_EQ(settings.at("optimizer"), "none");
  EXPECT_EQ(settings.count("lr"), 0u);
  EXPECT_EQ(JobDifferences(settings, JobSettings(none)), "");
  EXPECT_EQ(JobDifferences(JobSettings(sgd), settings), "optimizer sgd in the checkpoint, none now");
  std::map<std::string, std::string> older = JobSettings(sgd);
  older.erase("optimizer");
  EXPECT_EQ(JobDifferences(settings, older), "optimizer none in the checkpoint, sgd now");
}

}  // namespace
}  // namespace ps::server
