// Shard failover, as processes: a 2-worker job on 2 and on 4 server shards
// whose shards are killed (SIGKILL) and restarted on their ports from their
// checkpoint directories ends with weights bit-identical to the same job
// without faults: one shard at a random step, twice, then every shard at
// once. A shard restarted with another job's checkpoint directory is
// refused by name. The kill times come from a seed the test prints;
// PS_KILL_SEED=<seed> replays them (bazel test --test_env=PS_KILL_SEED=...),
// and PS_SHARD_FAULT_DIR=<dir> keeps every process's log and checkpoints
// there for a look afterwards.

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/testing/subprocess.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/process.h"

namespace ps {
namespace {

using ::testing::HasSubstr;
using tests::Process;
using tests::WaitForLog;
using tests::WaitForPortFile;

// 4 epochs of 128 steps: long enough for the kills to land while the job
// trains (each waits for a checkpoint written after the last restart).
constexpr int kEpochs = 4;
constexpr int kCheckpointEvery = 5;
// Enough to cover how far one shard's writes may lag behind another's on a
// loaded disk (each is fsynced): the versions a restore may go back to.
constexpr int kCheckpointKeep = 40;

// How often `text` occurs in `log`.
int Count(const std::string& log, const std::string& text) {
  int n = 0;
  for (size_t at = log.find(text); at != std::string::npos; at = log.find(text, at + 1)) ++n;
  return n;
}

// The seed of the kill times: PS_KILL_SEED, else a random one; printed.
unsigned KillSeed() {
  const char* given = std::getenv("PS_KILL_SEED");
  const unsigned seed = given != nullptr ? static_cast<unsigned>(std::strtoul(given, nullptr, 10))
                                         : std::random_device()();
  std::printf("kill timing seed %u (replay: PS_KILL_SEED=%u)\n", seed, seed);
  std::fflush(stdout);
  return seed;
}

// One job: S shards (each restartable on its port, from its directory) and
// two workers.
class Job {
 public:
  Job(const std::string& name, int shards)
      : dir_(std::getenv("PS_SHARD_FAULT_DIR") != nullptr
                 ? absl::StrCat(std::getenv("PS_SHARD_FAULT_DIR"), "/", name)
                 : testing::TestTmpPath(name)),
        ports_(shards, 0),
        starts_(shards, 0) {
    std::system(("rm -rf " + dir_ + " && mkdir -p " + dir_).c_str());
    servers_.resize(shards);
  }

  std::string checkpoints(int s) const { return absl::StrCat(dir_, "/checkpoints", s); }

  // Starts (or restarts) shard s on its port from `checkpoint_dir` (its
  // own by default).
  void StartShard(int s, const std::string& checkpoint_dir = "") {
    const std::string port_file = absl::StrCat(dir_, "/port", s, "-", starts_[s]);
    servers_[s] = std::make_unique<Process>(
        testing::RunfilePath("server/server"),
        std::vector<std::string>{
            absl::StrCat("--port=", ports_[s]), "--port_file=" + port_file, "--num_workers=2",
            "--lr=0.1", "--momentum=0.9", "--weight_decay=5e-4",
            "--checkpoint_dir=" + (checkpoint_dir.empty() ? checkpoints(s) : checkpoint_dir),
            absl::StrCat("--checkpoint_every_steps=", kCheckpointEvery),
            absl::StrCat("--checkpoint_keep=", kCheckpointKeep)},
        absl::StrCat(dir_, "/server", s, "-", starts_[s], ".log"));
    ++starts_[s];
    ports_[s] = WaitForPortFile(port_file);
    ASSERT_GT(ports_[s], 0) << servers_[s]->Log();
  }
  void StartShards() {
    for (int s = 0; s < shards(); ++s) ASSERT_NO_FATAL_FAILURE(StartShard(s));
  }

  void StartWorkers() {
    std::vector<std::string> addresses;
    for (int port : ports_) addresses.push_back(absl::StrCat("127.0.0.1:", port));
    for (int r = 0; r < 2; ++r) {
      workers_.push_back(std::make_unique<Process>(
          testing::RunfilePath("worker/worker"),
          std::vector<std::string>{
              "--server=" + absl::StrJoin(addresses, ","), absl::StrCat("--worker_id=w", r),
              absl::StrCat("--rank=", r), "--model=mlp", "--mlp_hidden=64", "--seed=3",
              "--dataset=synthetic", "--batch_size=64", absl::StrCat("--epochs=", kEpochs),
              "--devices=cpu", "--threads=1",
              "--progress=false", "--evaluate=false", "--reconnect_timeout=60s",
              "--save_weights=" + weights(r)},
          absl::StrCat(dir_, "/worker", r, ".log")));
    }
  }

  // Checkpoints shard s has written past version 0 (version 0's is written
  // before the workers train: a kill then may fall while they register,
  // which can fail their start, as with one server).
  int TrainedCheckpoints(int s) const {
    const std::string log = servers_[s]->Log();
    return Count(log, "checkpoint of version") - Count(log, "checkpoint of version 0 ");
  }

  // Waits until shard s has written one more checkpoint past version 0,
  // then a random 0-40 ms more: a random step while the job trains.
  void WaitForProgress(int s, std::mt19937* rng) {
    const int before = TrainedCheckpoints(s);
    const auto start = std::chrono::steady_clock::now();
    while (TrainedCheckpoints(s) == before) {
      ASSERT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60))
          << servers_[s]->Log();
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    std::this_thread::sleep_for(
        std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 40)(*rng)));
  }

  // Whether a worker has finished (a kill after that tests nothing).
  bool Finished() const {
    for (const auto& w : workers_) {
      if (w->Log().find("final train loss") != std::string::npos) return true;
    }
    return false;
  }

  void Kill(int s) {
    ASSERT_FALSE(Finished()) << "the job ended before the kill: make it longer";
    servers_[s]->Signal(SIGKILL);
    EXPECT_EQ(servers_[s]->Wait(std::chrono::seconds(10)), -1);  // by the signal
  }

  // Waits until both workers have recovered more often than `before`.
  void WaitForRecovery(const std::vector<int>& before) {
    const auto start = std::chrono::steady_clock::now();
    for (int r = 0; r < 2; ++r) {
      while (Recoveries(r) <= before[r]) {
        ASSERT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(90))
            << workers_[r]->Log();
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    std::printf("  training again %.0f ms after the kill\n",
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                    .count());
  }
  int Recoveries(int r) const { return Count(workers_[r]->Log(), "resumed at version"); }

  void FinishAndStop() {
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(workers_[r]->Wait(std::chrono::seconds(240)), 0) << workers_[r]->Log();
    }
    for (auto& server : servers_) {
      server->Signal(SIGTERM);
      EXPECT_EQ(server->Wait(std::chrono::seconds(30)), 0) << server->Log();
    }
  }

  int shards() const { return static_cast<int>(servers_.size()); }
  Process& worker(int r) { return *workers_[r]; }
  Process& server(int s) { return *servers_[s]; }
  std::string weights(int r) const { return absl::StrCat(dir_, "/weights", r, ".safetensors"); }

 private:
  const std::string dir_;
  std::vector<int> ports_;
  std::vector<int> starts_;
  std::vector<std::unique_ptr<Process>> servers_;
  std::vector<std::unique_ptr<Process>> workers_;
};

void ExpectSameWeights(Job& job, Job& reference) {
  for (int r = 0; r < 2; ++r) {
    const std::string want = testing::ReadFileBytes(reference.weights(r));
    ASSERT_FALSE(want.empty());
    EXPECT_TRUE(testing::ReadFileBytes(job.weights(r)) == want)
        << "worker " << r << "'s final weights differ from the fault-free run's";
  }
}

// The fault-free run, then one shard killed at a random step twice, then
// every shard at once: each run bit-identical to the first.
void KillShards(int shards) {
  const auto start = std::chrono::steady_clock::now();
  Job reference(absl::StrCat("reference", shards), shards);
  ASSERT_NO_FATAL_FAILURE(reference.StartShards());
  reference.StartWorkers();
  reference.FinishAndStop();
  std::printf("%d shards, fault-free: %.1f s\n", shards,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());

  std::mt19937 rng(KillSeed());
  {
    Job job(absl::StrCat("one", shards), shards);
    ASSERT_NO_FATAL_FAILURE(job.StartShards());
    job.StartWorkers();
    for (int kill = 0; kill < 2; ++kill) {
      const int s = std::uniform_int_distribution<int>(0, shards - 1)(rng);
      ASSERT_NO_FATAL_FAILURE(job.WaitForProgress(s, &rng));
      const std::vector<int> before = {job.Recoveries(0), job.Recoveries(1)};
      std::printf("kill %d: shard %d of %d\n", kill + 1, s, shards);
      ASSERT_NO_FATAL_FAILURE(job.Kill(s));
      ASSERT_NO_FATAL_FAILURE(job.StartShard(s));
      ASSERT_NO_FATAL_FAILURE(job.WaitForRecovery(before));
    }
    job.FinishAndStop();
    ExpectSameWeights(job, reference);
  }
  {
    Job job(absl::StrCat("all", shards), shards);
    ASSERT_NO_FATAL_FAILURE(job.StartShards());
    job.StartWorkers();
    // Once every shard has a checkpoint: one lost before its first is
    // refused while the others are past version 0 (sharding.md).
    for (int s = 0; s < shards; ++s) ASSERT_NO_FATAL_FAILURE(job.WaitForProgress(s, &rng));
    const std::vector<int> before = {job.Recoveries(0), job.Recoveries(1)};
    std::printf("kill: all %d shards\n", shards);
    for (int s = 0; s < shards; ++s) job.server(s).Signal(SIGKILL);
    for (int s = 0; s < shards; ++s) ASSERT_NO_FATAL_FAILURE(job.Kill(s));
    for (int s = 0; s < shards; ++s) ASSERT_NO_FATAL_FAILURE(job.StartShard(s));
    ASSERT_NO_FATAL_FAILURE(job.WaitForRecovery(before));
    job.FinishAndStop();
    ExpectSameWeights(job, reference);
    for (int r = 0; r < 2; ++r) {
      EXPECT_THAT(job.worker(r).Log(), HasSubstr("the server was lost"));
    }
  }
  std::printf("%d shards: %.1f s in all\n", shards,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

TEST(ShardFaultTest, TwoShardsKilledEndBitIdentical) { KillShards(2); }

TEST(ShardFaultTest, FourShardsKilledEndBitIdentical) { KillShards(4); }

// Shard 1 of a job restarted with the checkpoint directory of another job
// (same settings, another run): both workers stop, naming the shard and
// the problem.
TEST(ShardFaultTest, AShardWithAnotherJobsCheckpointsIsRefusedByName) {
  Job other("other", 2);
  ASSERT_NO_FATAL_FAILURE(other.StartShards());
  other.StartWorkers();
  other.FinishAndStop();

  Job job("this", 2);
  ASSERT_NO_FATAL_FAILURE(job.StartShards());
  job.StartWorkers();
  std::mt19937 rng(1);
  ASSERT_NO_FATAL_FAILURE(job.WaitForProgress(1, &rng));
  ASSERT_NO_FATAL_FAILURE(job.Kill(1));
  ASSERT_NO_FATAL_FAILURE(job.StartShard(1, other.checkpoints(1)));
  // The first worker to reconnect is refused; the other may be left
  // waiting for it on shard 0 (the job would fail at the worker-loss
  // timeout), so it is stopped once one has said why.
  const auto start = std::chrono::steady_clock::now();
  int refused = -1;
  while (refused < 0 && std::chrono::steady_clock::now() - start < std::chrono::seconds(120)) {
    for (int r = 0; r < 2 && refused < 0; ++r) {
      if (job.worker(r).Log().find("another job run") != std::string::npos) refused = r;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_GE(refused, 0) << job.worker(0).Log() << job.worker(1).Log();
  EXPECT_EQ(job.worker(refused).Wait(std::chrono::seconds(30)), 1) << job.worker(refused).Log();
  const std::string log = job.worker(refused).Log();
  std::printf("worker %d: %s\n", refused, log.substr(log.find("FAILED_PRECONDITION")).c_str());
  EXPECT_THAT(log, HasSubstr("shard 1 of 2"));
  EXPECT_THAT(log, HasSubstr("another job run"));
  job.worker(1 - refused).Signal(SIGKILL);
  job.worker(1 - refused).Wait(std::chrono::seconds(10));
  for (int s = 0; s < 2; ++s) {
    job.server(s).Signal(SIGTERM);
    EXPECT_EQ(job.server(s).Wait(std::chrono::seconds(30)), 0) << job.server(s).Log();
  }
}

}  // namespace
}  // namespace ps
