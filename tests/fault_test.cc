// Faults, as processes: a 2-worker LeNet job on Fashion-MNIST whose server
// is killed (SIGKILL) three times at random moments and restarted from its
// checkpoints, and one whose server is stopped with SIGTERM mid-run and
// restarted, end with weights bit-identical to a run without faults; a
// corrupt newest checkpoint is refused by name and the previous one used.

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/subprocess.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/process.h"

namespace ps {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using tests::Process;
using tests::WaitForLog;
using tests::WaitForPortFile;

constexpr int kSteps = 400;
constexpr int kCheckpointEvery = 5;


// One job: a server (restartable on the same port) and two workers.
class Job {
 public:
  explicit Job(const std::string& name) : name_(name), dir_(testing::TestTmpPath(name)) {
    std::system(("rm -rf " + dir_ + " && mkdir -p " + dir_).c_str());
  }

  // Starts (or restarts) the server; the first start picks a free port.
  void StartServer() {
    const std::string port_file = absl::StrCat(dir_, "/port", starts_);
    std::vector<std::string> args = {
        absl::StrCat("--port=", port_), "--port_file=" + port_file, "--num_workers=2",
        "--lr=0.1", "--momentum=0.9", "--checkpoint_dir=" + dir_ + "/checkpoints",
        absl::StrCat("--checkpoint_every_steps=", kCheckpointEvery)};
    server_ = std::make_unique<Process>(testing::RunfilePath("server/server"), args,
                                        absl::StrCat(dir_, "/server", starts_, ".log"));
    ++starts_;
    port_ = WaitForPortFile(port_file);
    ASSERT_GT(port_, 0) << server_->Log();
  }

  void StartWorkers() {
    for (int r = 0; r < 2; ++r) {
      workers_.push_back(std::make_unique<Process>(
          testing::RunfilePath("worker/worker"),
          std::vector<std::string>{absl::StrCat("--server=127.0.0.1:", port_),
                                   absl::StrCat("--worker_id=w", r), absl::StrCat("--rank=", r),
                                   "--model=lenet", "--batch_size=128", "--epochs=1",
                                   absl::StrCat("--max_steps=", kSteps), "--seed=7",
                                   "--devices=cpu", "--threads=1", "--evaluate=false",
                                   "--progress=false", "--reconnect_timeout=120s",
                                   absl::StrCat("--save_weights=", weights(r)),
                                   absl::StrCat("--report=", dir_, "/report", r, ".json")},
          absl::StrCat(dir_, "/worker", r, ".log")));
    }
  }

  // Waits until the current server has written a checkpoint past version
  // 0 after it started (so training runs on it: version 0's is written
  // before the workers train), then a random 0-150 ms more: a few to a few
  // dozen steps, so that three kills fit in the run on a faster machine
  // too.
  void WaitUntilTraining(std::mt19937* rng) {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      const std::string log = server_->Log();
      size_t written = 0;
      for (size_t at = log.find("checkpoint of version "); at != std::string::npos;
           at = log.find("checkpoint of version ", at + 1)) {
        written += log.compare(at, 24, "checkpoint of version 0 ") != 0;
      }
      if (written > 0) break;
      ASSERT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(120)) << log;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::this_thread::sleep_for(
        std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 150)(*rng)));
  }

  void FinishAndStop() {
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(workers_[r]->Wait(std::chrono::seconds(300)), 0) << workers_[r]->Log();
    }
    server_->Signal(SIGTERM);
    EXPECT_EQ(server_->Wait(std::chrono::seconds(30)), 0) << server_->Log();
  }

  Process& server() { return *server_; }
  Process& worker(int r) { return *workers_[r]; }
  std::string weights(int r) const { return absl::StrCat(dir_, "/weights", r, ".safetensors"); }
  std::string checkpoints() const { return dir_ + "/checkpoints"; }
  std::string report(int r) const { return testing::ReadFileBytes(absl::StrCat(dir_, "/report", r, ".json")); }
  const std::string& dir() const { return dir_; }

 private:
  const std::string name_;
  const std::string dir_;
  int port_ = 0;
  int starts_ = 0;
  std::unique_ptr<Process> server_;
  std::vector<std::unique_ptr<Process>> workers_;
};

class FaultTest : public ::testing::Test {
 protected:
  // The fault-free run, once for all tests.
  static void SetUpTestSuite() {
    reference_ = new Job("reference");
    reference_->StartServer();
    reference_->StartWorkers();
    reference_->FinishAndStop();
  }
  static void TearDownTestSuite() { delete reference_; }

  static void ExpectSameWeights(const Job& job) {
    for (int r = 0; r < 2; ++r) {
      const std::string got = testing::ReadFileBytes(job.weights(r));
      const std::string want = testing::ReadFileBytes(reference_->weights(r));
      ASSERT_FALSE(want.empty());
      EXPECT_TRUE(got == want) << "worker " << r << "'s final weights differ from the fault-free "
                               << "run's (" << job.weights(r) << " vs " << reference_->weights(r)
                               << ")";
    }
  }

  static Job* reference_;
};

Job* FaultTest::reference_ = nullptr;

TEST_F(FaultTest, ServerKilledThreeTimesEndsBitIdentical) {
  std::random_device seed_source;
  const unsigned seed = seed_source();
  std::printf("kill timing seed %u\n", seed);
  std::mt19937 rng(seed);
  Job job("killed");
  job.StartServer();
  job.StartWorkers();
  for (int kill = 0; kill < 3; ++kill) {
    job.WaitUntilTraining(&rng);
    const auto killed = std::chrono::steady_clock::now();
    job.server().Signal(SIGKILL);
    EXPECT_EQ(job.server().Wait(std::chrono::seconds(10)), -1);  // by a signal
    job.StartServer();  // as a restart policy would, at once
    // Training again: both workers have resumed from this kill.
    for (int r = 0; r < 2; ++r) {
      for (;;) {
        const std::string log = job.worker(r).Log();
        int resumed = 0;
        for (size_t at = log.find("resumed at version"); at != std::string::npos;
             at = log.find("resumed at version", at + 1)) {
          ++resumed;
        }
        if (resumed > kill) break;
        ASSERT_LT(std::chrono::steady_clock::now() - killed, std::chrono::seconds(120)) << log;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    std::printf("kill %d: training again %.0f ms after the SIGKILL (server restarted at once)\n",
                kill + 1,
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - killed)
                    .count());
  }
  job.FinishAndStop();
  ExpectSameWeights(job);
  // Each kill fell while both workers trained (the restarted server had
  // written a checkpoint): each worker recovered from every one, and says
  // when and how long it took.
  for (int r = 0; r < 2; ++r) {
    const std::string log = job.worker(r).Log();
    int recoveries = 0;
    std::istringstream lines(log);
    for (std::string line; std::getline(lines, line);) {
      if (line.find("the server was lost") == std::string::npos) continue;
      ++recoveries;
      std::printf("%s\n", line.c_str());
    }
    EXPECT_EQ(recoveries, 3) << log;
    EXPECT_THAT(job.report(r), HasSubstr("\"resumed_version\""));
  }
}

TEST_F(FaultTest, ServerStoppedWithSigtermWritesAFinalCheckpointAndTheJobResumes) {
  std::mt19937 rng(1);
  Job job("sigterm");
  job.StartServer();
  job.StartWorkers();
  job.WaitUntilTraining(&rng);
  const auto stop_start = std::chrono::steady_clock::now();
  job.server().Signal(SIGTERM);
  EXPECT_EQ(job.server().Wait(std::chrono::seconds(20)), 0) << job.server().Log();
  const double stop_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - stop_start).count();
  std::printf("SIGTERM to exit: %.2f s\n", stop_s);
  const std::string log = job.server().Log();
  EXPECT_THAT(log, HasSubstr("stopping at version"));
  // The final checkpoint is of the version it stopped at or the next.
  EXPECT_THAT(log, HasSubstr("checkpoint of version"));
  EXPECT_THAT(log, Not(HasSubstr("no final checkpoint")));
  job.StartServer();
  EXPECT_THAT(job.server().Log(), HasSubstr("resumed at version"));
  job.FinishAndStop();
  ExpectSameWeights(job);
  for (int r = 0; r < 2; ++r) {
    // Told the server was shutting down, not failed.
    EXPECT_THAT(job.worker(r).Log(), HasSubstr("the server was lost at step"));
  }
}

TEST_F(FaultTest, ACorruptNewestCheckpointIsRefusedByNameAndThePreviousOneUsed) {
  // The reference run's checkpoints: versions kSteps (final) and the two
  // before it. Truncate the newest's parameters, flip a bit in the next's.
  const std::string dir = reference_->checkpoints();
  auto params = [&](int version) {
    char name[64];
    std::snprintf(name, sizeof(name), "/params-%012d.safetensors", version);
    return dir + name;
  };
  const int newest = kSteps;
  int next = newest - 1;
  while (next > 0 && testing::ReadFileBytes(params(next)).empty()) --next;
  ASSERT_GT(next, 0);
  int third = next - 1;
  while (third > 0 && testing::ReadFileBytes(params(third)).empty()) --third;
  ASSERT_GT(third, 0);
  const std::string full = testing::ReadFileBytes(params(newest));
  std::ofstream(params(newest), std::ios::binary | std::ios::trunc) << full.substr(0, full.size() / 2);
  std::string flipped = testing::ReadFileBytes(params(next));
  flipped[flipped.size() - 3] ^= 0x10;
  std::ofstream(params(next), std::ios::binary | std::ios::trunc) << flipped;

  Process server(testing::RunfilePath("server/server"),
                 {"--port=0", "--port_file=" + testing::TestTmpPath("corrupt.port"),
                  "--num_workers=2", "--lr=0.1", "--momentum=0.9", "--checkpoint_dir=" + dir},
                 testing::TestTmpPath("corrupt.log"));
  ASSERT_TRUE(WaitForLog(server, "parameter server for", std::chrono::seconds(60))) << server.Log();
  const std::string log = server.Log();
  EXPECT_THAT(log, HasSubstr(params(newest)));
  EXPECT_THAT(log, HasSubstr(params(next)));
  EXPECT_THAT(log, HasSubstr(absl::StrCat("resumed at version ", third)));
  server.Signal(SIGTERM);
  EXPECT_EQ(server.Wait(std::chrono::seconds(20)), 0);

  // Another job's settings are refused, naming the difference.
  Process other(testing::RunfilePath("server/server"),
                {"--port=0", "--num_workers=2", "--lr=0.5", "--momentum=0.9",
                 "--checkpoint_dir=" + dir},
                testing::TestTmpPath("other.log"));
  EXPECT_EQ(other.Wait(std::chrono::seconds(60)), 1);
  EXPECT_THAT(other.Log(), HasSubstr("lr 0.1 in the checkpoint, 0.5 now"));
}

}  // namespace
}  // namespace ps
