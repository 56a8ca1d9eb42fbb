// deploy/local_cluster.sh, the README's first command, shortened: the same
// job (one server, two workers, LeNet on Fashion-MNIST, seed 0) for two
// epochs instead of ten, on the daemons from this test's runfiles (--bin),
// so nothing is installed or built. It trains (loss and test accuracy well
// past chance), exits 0 and leaves no process behind; SIGTERM mid-run stops
// every process it started; bad flags are refused before anything starts.

#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <regex>
#include <string>
#include <vector>

#include "common/testing/subprocess.h"
#include "tests/process.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

using ::testing::HasSubstr;

constexpr char kDataDir[] = "/usr/share/datasets/fashion-mnist";

// The folder --bin takes: the runfiles root, where server/server and
// worker/worker are.
std::string RunfilesBin() {
  const std::string server = testing::RunfilePath("server/server");
  return server.substr(0, server.size() - std::string("/server/server").size());
}

// local_cluster.sh as a child in a process group of its own, with stdout
// and stderr in a log file: every process the script starts (daemons, its
// progress tail) joins that group unless it leaves it, so an empty group
// after the script exits means it left nothing running. Anything still in
// the group on destruction is killed.
class ClusterScript : public tests::Process {
 public:
  ClusterScript(std::vector<std::string> flags, const std::string& log)
      : Process("/bin/bash", WithScript(std::move(flags)), log, Group::kOwn) {}

  bool WaitForLog(const std::string& text, std::chrono::seconds timeout) const {
    return tests::WaitForLog(*this, text, timeout);
  }

 private:
  static std::vector<std::string> WithScript(std::vector<std::string> flags) {
    flags.insert(flags.begin(), testing::RunfilePath("deploy/local_cluster.sh"));
    return flags;
  }
};

bool IsDirectory(const std::string& path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
}

TEST(LocalClusterTest, TrainsTwoEpochsAndStopsEverything) {
  ASSERT_TRUE(IsDirectory(kDataDir))
      << kDataDir << " is missing: install Debian's dataset-fashion-mnist (deploy/setup.sh main)";
  const std::string logs = testing::TestTmpPath("train");
  ClusterScript script({"--bin=" + RunfilesBin(), "--epochs=2", "--logs=" + logs},
                       testing::TestTmpPath("train.log"));
  const int code = script.Wait(std::chrono::seconds(240));
  const std::string log = script.Log();
  std::printf("%s", log.c_str());
  ASSERT_EQ(code, 0) << log;
  EXPECT_FALSE(script.GroupAlive()) << "a process of the cluster outlived the script";

  EXPECT_THAT(log, HasSubstr("local_cluster: server at 127.0.0.1:"));
  EXPECT_THAT(log, HasSubstr("worker 0/2: training lenet"));
  EXPECT_THAT(log, HasSubstr("local_cluster: done; logs in " + logs));
  // Seed 0 gives loss 1.36 and test accuracy 0.60 after the second epoch
  // (0.1 and ln 10 = 2.30 are chance): the bounds leave room for another
  // machine's rounding, not for a job that does not learn.
  std::smatch epoch;
  const std::regex epoch_line(R"(epoch 2/2  loss ([0-9.]+)  train acc [0-9.]+  test acc ([0-9.]+))");
  ASSERT_TRUE(std::regex_search(log, epoch, epoch_line)) << log;
  EXPECT_LT(std::stod(epoch[1]), 2.0) << epoch[0];
  EXPECT_GT(std::stod(epoch[2]), 0.4) << epoch[0];
  // The second worker trained to the end too.
  EXPECT_THAT(testing::ReadFileBytes(logs + "/worker-1.log"), HasSubstr("worker 1: final"));
}

TEST(LocalClusterTest, SigtermStopsEveryProcess) {
  ASSERT_TRUE(IsDirectory(kDataDir))
      << kDataDir << " is missing: install Debian's dataset-fashion-mnist (deploy/setup.sh main)";
  const std::string logs = testing::TestTmpPath("stopped");
  ClusterScript script({"--bin=" + RunfilesBin(), "--epochs=10", "--logs=" + logs},
                       testing::TestTmpPath("stopped.log"));
  // Worker 0 says so once it has joined the job: the server and both
  // workers are running then.
  ASSERT_TRUE(script.WaitForLog("worker 0/2: training lenet", std::chrono::seconds(60)))
      << script.Log();
  script.Signal(SIGTERM);
  const int code = script.Wait(std::chrono::seconds(30));
  const std::string log = script.Log();
  std::printf("%s", log.c_str());
  EXPECT_EQ(code, 130) << log;
  EXPECT_THAT(log, HasSubstr("local_cluster: interrupted"));
  EXPECT_FALSE(script.GroupAlive()) << "a process of the cluster outlived the script";
  EXPECT_THAT(log, ::testing::Not(HasSubstr("local_cluster: done")));
}

TEST(LocalClusterTest, RefusesBadFlagsBeforeStartingAnything) {
  struct Case {
    std::vector<std::string> flags;
    std::string error;
  };
  const std::vector<Case> cases = {
      {{"--bin=" + RunfilesBin(), "--steps=ten"},
       "--steps must be a non-negative integer, got 'ten'"},
      {{"--bin=" + RunfilesBin(), "--servers=0"}, "--servers must be a positive integer"},
      {{"--bin=" + testing::TestTmpPath("nowhere")}, "no server/server under"},
      {{"--epoch=1"}, "unknown flag --epoch=1"},
  };
  for (const Case& c : cases) {
    ClusterScript script(c.flags, testing::TestTmpPath("refused.log"));
    EXPECT_EQ(script.Wait(std::chrono::seconds(30)), 2) << script.Log();
    EXPECT_THAT(script.Log(), HasSubstr(c.error));
    EXPECT_THAT(script.Log(), ::testing::Not(HasSubstr("server at")));
  }
}

}  // namespace
}  // namespace ps
