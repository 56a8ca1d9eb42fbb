// The daemons as separate processes: a server and two workers on loopback
// train a small model to the end; the server answers gRPC health checks
// (and ps-health, the containers' health check, reads them);
// a worker with a different model is refused with the difference named.

#include <signal.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/testing/subprocess.h"
#include "proto/health.grpc.pb.h"
#include "tests/process.h"

namespace ps {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using tests::Process;
using tests::WaitForLog;
using tests::WaitForPortFile;

TEST(ClusterTest, ServerAndTwoWorkerProcessesTrainToTheEnd) {
  const std::string port_file = testing::TestTmpPath("port");
  const std::vector<std::string> model = {"--model=mlp", "--mlp_hidden=32", "--seed=3"};
  // The server is told nothing of the model: the workers state it.
  const std::vector<std::string> server_args = {"--port=0", "--port_file=" + port_file,
                                                "--num_workers=2", "--lr=0.1",
                                                "--momentum=0.9"};
  Process server(testing::RunfilePath("server/server"), server_args, testing::TestTmpPath("server.log"));
  const int port = WaitForPortFile(port_file);
  ASSERT_GT(port, 0) << server.Log();
  const std::string address = absl::StrCat("127.0.0.1:", port);

  // gRPC health: SERVING.
  auto health = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::health::v1::HealthCheckRequest request;
    grpc::health::v1::HealthCheckResponse response;
    ASSERT_TRUE(health->Check(&context, request, &response).ok());
    EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  }
  // ps-health, the containers' health check, says the same through its exit
  // status (0: serving), and 2 for an address where nothing listens.
  {
    const std::string health_check = testing::RunfilePath("server/health_check");
    std::string output;
    EXPECT_EQ(testing::RunCommand(health_check + " --address=" + address, &output), 0) << output;
    EXPECT_THAT(output, HasSubstr(address + " SERVING"));
    // Port 1 (tcpmux) is privileged and unused here: a refused connection.
    const std::string closed = "127.0.0.1:1";
    EXPECT_EQ(testing::RunCommand(health_check + " --address=" + closed + " --timeout=2s", &output),
              2)
        << output;
    EXPECT_THAT(output, HasSubstr(closed + " not reached"));
    // Reached, but asked about a service it does not have: 1, not "not
    // reached"; and a timeout of 0 is a bad flag (3).
    EXPECT_EQ(testing::RunCommand(health_check + " --address=" + address + " --service=typo",
                                  &output),
              1)
        << output;
    EXPECT_THAT(output, HasSubstr(address + " refused the check"));
    EXPECT_EQ(testing::RunCommand(health_check + " --address=" + address + " --timeout=0s",
                                  &output),
              3)
        << output;
  }

  std::vector<std::unique_ptr<Process>> workers;
  for (int r = 0; r < 2; ++r) {
    std::vector<std::string> args = {"--server=" + address,
                                     absl::StrCat("--worker_id=w", r),
                                     absl::StrCat("--rank=", r),
                                     "--dataset=synthetic",
                                     "--batch_size=64",
                                     "--epochs=2",
                                     "--max_steps=60",
                                     "--devices=cpu:2",
                                     "--threads=1",
                                     "--progress=false",
                                     absl::StrCat("--report=", testing::TestTmpPath(absl::StrCat("r", r, ".json")))};
    args.insert(args.end(), model.begin(), model.end());
    if (r == 1) args.push_back("--evaluate=false");
    workers.push_back(std::make_unique<Process>(testing::RunfilePath("worker/worker"), args,
                                                testing::TestTmpPath(absl::StrCat("worker", r, ".log"))));
  }
  // Once both have registered (the first stated the model, rank 0 sent the
  // initial parameters), a worker whose model differs is refused, naming
  // the difference.
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(WaitForLog(*workers[r], absl::StrCat("worker ", r, "/2: training"),
                           std::chrono::seconds(120)))
        << workers[r]->Log();
  }
  Process stranger(testing::RunfilePath("worker/worker"),
                   {"--server=" + address, "--worker_id=stranger", "--model=mlp",
                    "--mlp_hidden=33", "--dataset=synthetic", "--batch_size=64", "--epochs=1",
                    "--devices=cpu",
                    "--threads=1", "--progress=false"},
                   testing::TestTmpPath("stranger.log"));
  EXPECT_EQ(stranger.Wait(std::chrono::seconds(60)), 1);
  EXPECT_THAT(stranger.Log(), HasSubstr("FAILED_PRECONDITION"));
  EXPECT_THAT(stranger.Log(), HasSubstr("'fc1.weight' has shape [32, 784] on the server but "
                                        "[33, 784] on the worker"));
  // A worker given an optimizer flag in a server job is refused at start,
  // pointed to the server's flag.
  Process misconfigured(testing::RunfilePath("worker/worker"),
                        {"--server=" + address, "--worker_id=lr", "--model=mlp", "--lr=0.5",
                         "--dataset=synthetic", "--progress=false"},
                        testing::TestTmpPath("misconfigured.log"));
  EXPECT_EQ(misconfigured.Wait(std::chrono::seconds(60)), 1);
  EXPECT_THAT(misconfigured.Log(), HasSubstr("--lr is the server's with --server"));
  EXPECT_THAT(misconfigured.Log(), HasSubstr("bazel-bin/server/server --lr="));

  std::string logs;
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(workers[r]->Wait(std::chrono::seconds(240)), 0) << workers[r]->Log();
    logs += workers[r]->Log();
    // One model's worth each way per step over the wire.
    EXPECT_THAT(workers[r]->Log(), HasSubstr("pushed 101800 and pulled 101800 bytes per step "
                                             "(model: 101800 bytes)"));
  }
  // A worker that does not evaluate shows no test figures (not -1).
  EXPECT_THAT(workers[1]->Log(), HasSubstr("worker 1: final train loss"));
  EXPECT_THAT(workers[1]->Log(), Not(HasSubstr("test acc")));
  EXPECT_THAT(workers[1]->Log(), Not(HasSubstr("-1.0")));
  // Each worker got the rank it asked for.
  EXPECT_THAT(workers[0]->Log(), HasSubstr("worker 0/2"));
  EXPECT_THAT(workers[1]->Log(), HasSubstr("worker 1/2"));
  std::ifstream report(testing::TestTmpPath("r0.json"));
  std::stringstream json;
  json << report.rdbuf();
  EXPECT_THAT(json.str(), HasSubstr("\"steps\": 60"));
  EXPECT_THAT(json.str(), HasSubstr("\"num_workers\": 2"));

  server.Signal(SIGTERM);
  EXPECT_EQ(server.Wait(std::chrono::seconds(20)), 0) << server.Log();
  EXPECT_THAT(server.Log(), HasSubstr("stopping at version 60"));
}

// Numeric flags out of range are refused at start, each named, never read
// as "off", "no limit" or "at once".
TEST(ClusterTest, AServerWithNumericFlagsOutOfRangeRefusesToStartNamingThem) {
  Process server(testing::RunfilePath("server/server"),
                 {"--num_workers=1", "--port=0", "--checkpoint_keep=0", "--liveness_timeout=0s",
                  "--stop_timeout=inf", "--grpc_memory_limit_mb=-5"},
                 testing::TestTmpPath("bad-flags.log"));
  EXPECT_NE(server.Wait(std::chrono::seconds(20)), 0);
  for (const char* named : {"--checkpoint_keep=0", "--liveness_timeout=0", "--stop_timeout=inf",
                            "--grpc_memory_limit_mb=-5"}) {
    EXPECT_THAT(server.Log(), HasSubstr(named));
  }
}

}  // namespace
}  // namespace ps
