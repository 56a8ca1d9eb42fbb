// The daemons with a sharded model: two server processes and two workers
// given both addresses train to the end, each worker pushing and pulling one
// model's worth per step across the shards, and end with the same weights,
// byte for byte, as the same job on one server. A worker that lists the
// shards in another order is refused by the shard it reaches first.

#include <signal.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/testing/subprocess.h"
#include "tests/process.h"

namespace ps {
namespace {

using ::testing::HasSubstr;
using tests::Process;
using tests::WaitForLog;
using tests::WaitForPortFile;

constexpr int kSteps = 30;

std::vector<std::string> WorkerArgs(const std::string& servers, int rank,
                                    const std::string& tag) {
  return {"--server=" + servers,
          absl::StrCat("--worker_id=w", rank),
          absl::StrCat("--rank=", rank),
          "--model=mlp",
          "--mlp_hidden=32",
          "--seed=3",
          "--dataset=synthetic",
          "--batch_size=64",
          "--epochs=1",
          absl::StrCat("--max_steps=", kSteps),
          "--devices=cpu",
          "--threads=1",
          "--progress=false",
          "--evaluate=false",
          "--save_weights=" + testing::TestTmpPath(absl::StrCat(tag, "-w", rank, ".safetensors"))};
}

// Runs `shards` servers and two workers to the end; returns worker 0's saved
// weights (empty on failure). `check(workers)` runs once both workers have
// registered, while they train.
std::string RunJob(int shards, const std::string& tag,
                   const std::function<void(const std::vector<std::string>&)>& check = {}) {
  std::vector<std::unique_ptr<Process>> servers;
  std::vector<std::string> addresses;
  for (int s = 0; s < shards; ++s) {
    const std::string port_file = testing::TestTmpPath(absl::StrCat(tag, "-port", s));
    servers.push_back(std::make_unique<Process>(
        testing::RunfilePath("server/server"),
        std::vector<std::string>{"--port=0", "--port_file=" + port_file, "--num_workers=2",
                                 "--lr=0.1", "--momentum=0.9", "--weight_decay=5e-4"},
        testing::TestTmpPath(absl::StrCat(tag, "-server", s, ".log"))));
    const int port = WaitForPortFile(port_file);
    EXPECT_GT(port, 0) << servers.back()->Log();
    if (port <= 0) return "";
    addresses.push_back(absl::StrCat("127.0.0.1:", port));
  }
  const std::string list = absl::StrJoin(addresses, ",");
  std::vector<std::unique_ptr<Process>> workers;
  for (int r = 0; r < 2; ++r) {
    workers.push_back(std::make_unique<Process>(
        testing::RunfilePath("worker/worker"), WorkerArgs(list, r, tag),
        testing::TestTmpPath(absl::StrCat(tag, "-worker", r, ".log"))));
  }
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(WaitForLog(*workers[r], absl::StrCat("worker ", r, "/2: training"),
                           std::chrono::seconds(120)))
        << workers[r]->Log();
  }
  if (check) check(addresses);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(workers[r]->Wait(std::chrono::seconds(240)), 0) << workers[r]->Log();
    // One model's worth each way per step, over all shards together.
    EXPECT_THAT(workers[r]->Log(), HasSubstr("pushed 101800 and pulled 101800 bytes per step "
                                             "(model: 101800 bytes)"));
    if (shards > 1) {
      EXPECT_THAT(workers[r]->Log(),
                  HasSubstr(absl::StrCat("optimizer on ", shards, " server shards")));
    }
  }
  for (auto& server : servers) {
    server->Signal(SIGTERM);
    EXPECT_EQ(server->Wait(std::chrono::seconds(20)), 0) << server->Log();
    // Every shard made every update.
    EXPECT_THAT(server->Log(), HasSubstr(absl::StrCat("stopping at version ", kSteps)));
  }
  return testing::ReadFileBytes(testing::TestTmpPath(absl::StrCat(tag, "-w0.safetensors")));
}

TEST(ShardsTest, TwoShardProcessesTrainLikeOneServerByteForByte) {
  const std::string one = RunJob(1, "one");
  const std::string two = RunJob(2, "two", [](const std::vector<std::string>& addresses) {
    // The same shards in the other order: the plan's first part reaches the
    // second shard, which holds the other part, and refuses it.
    Process reordered(testing::RunfilePath("worker/worker"),
                      WorkerArgs(addresses[1] + "," + addresses[0], 0, "reordered"),
                      testing::TestTmpPath("reordered.log"));
    EXPECT_EQ(reordered.Wait(std::chrono::seconds(60)), 1);
    EXPECT_THAT(reordered.Log(), HasSubstr("FAILED_PRECONDITION"));
    EXPECT_THAT(reordered.Log(), HasSubstr(absl::StrCat("shard 0 of 2 (", addresses[1], ")")));
    EXPECT_THAT(reordered.Log(), HasSubstr("different model"));
  });
  ASSERT_FALSE(one.empty());
  EXPECT_TRUE(one == two) << "the sharded job's weights differ from one server's";
}

}  // namespace
}  // namespace ps
