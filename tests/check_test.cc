// worker --check against a server that is down, one with another model, one
// with mutual TLS met without a client certificate, and a healthy one:
// four different diagnoses, each with its fix, and exit codes that say
// whether all passed.

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
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

// A --check run of the worker; returns its exit code and log.
int Check(const std::string& name, std::vector<std::string> args, std::string* log) {
  args.insert(args.end(), {"--check", "--dataset=synthetic", "--progress=false"});
  Process check(testing::RunfilePath("worker/worker"), args,
                testing::TestTmpPath(name + ".log"));
  const int code = check.Wait(std::chrono::seconds(60));
  *log = check.Log();
  std::printf("--- %s (exit %d)\n%s", name.c_str(), code, log->c_str());
  return code;
}

TEST(CheckTest, FourSituationsFourDiagnoses) {
  std::string log;
  // 1. Nothing listens.
  EXPECT_EQ(Check("down", {"--server=127.0.0.1:1", "--model=mlp"}, &log), 1) << log;
  EXPECT_THAT(log, HasSubstr("FAIL: TCP to 127.0.0.1:1: Connection refused"));
  EXPECT_THAT(log, HasSubstr("is the server running"));

  // 2 and 4: a server whose job a worker with an MLP has joined (it states
  // the model and sends the initial parameters, then waits for a second).
  const std::string port_file = testing::TestTmpPath("port");
  Process server(testing::RunfilePath("server/server"),
                 {"--port=0", "--port_file=" + port_file, "--num_workers=2"},
                 testing::TestTmpPath("server.log"));
  const int port = WaitForPortFile(port_file);
  ASSERT_GT(port, 0) << server.Log();
  const std::string address = absl::StrCat("127.0.0.1:", port);
  const std::vector<std::string> mlp = {"--model=mlp", "--mlp_hidden=32", "--dataset=synthetic",
                                        "--batch_size=64"};
  std::vector<std::string> joined = {"--server=" + address, "--worker_id=w0", "--rank=0",
                                     "--progress=false", "--evaluate=false"};
  joined.insert(joined.end(), mlp.begin(), mlp.end());
  Process first(testing::RunfilePath("worker/worker"), joined,
                testing::TestTmpPath("first.log"));
  ASSERT_TRUE(WaitForLog(first, "worker 0/2: training", std::chrono::seconds(60))) << first.Log();

  std::vector<std::string> other = {"--server=" + address, "--model=lenet"};
  EXPECT_EQ(Check("wrong_model", other, &log), 1) << log;
  EXPECT_THAT(log, HasSubstr("FAIL: the server's model differs: parameter 0 is 'fc1.weight' "
                             "on the server, 'conv1.weight' here"));
  EXPECT_THAT(log, HasSubstr("same --model"));

  std::vector<std::string> same = {"--server=" + address};
  same.insert(same.end(), mlp.begin(), mlp.end());
  EXPECT_EQ(Check("healthy", same, &log), 0) << log;
  EXPECT_THAT(log, HasSubstr("ok: the server answers: 1 of 2 workers registered"));
  EXPECT_THAT(log, HasSubstr("ok: the model matches"));
  EXPECT_THAT(log, HasSubstr("ok: round trip"));
  EXPECT_THAT(log, HasSubstr("ok: pulls"));
  EXPECT_THAT(log, HasSubstr("check: all passed"));
  EXPECT_THAT(log, Not(HasSubstr("FAIL")));
  first.Signal(SIGKILL);

  // 3. Mutual TLS, met with the CA but no client certificate.
  const std::string certs = testing::TestTmpPath("certs");
  std::string output;
  ASSERT_EQ(testing::RunCommand(absl::StrCat(testing::RunfilePath("deploy/tls/make_test_certs.sh"),
                                             " ", testing::ShellQuote(certs)),
                                &output),
            0)
      << output;
  const std::string tls_port_file = testing::TestTmpPath("tls.port");
  Process tls_server(testing::RunfilePath("server/server"),
                     {"--port=0", "--port_file=" + tls_port_file, "--num_workers=1",
                      "--tls_cert=" + certs + "/server.pem", "--tls_key=" + certs + "/server.key",
                      "--tls_client_ca=" + certs + "/ca.pem"},
                     testing::TestTmpPath("tls_server.log"));
  const int tls_port = WaitForPortFile(tls_port_file);
  ASSERT_GT(tls_port, 0) << tls_server.Log();
  EXPECT_EQ(Check("no_client_cert",
                  {absl::StrCat("--server=localhost:", tls_port), "--model=mlp",
                   "--tls_ca=" + certs + "/ca.pem"},
                  &log),
            1)
      << log;
  EXPECT_THAT(log, HasSubstr("ok: TCP connects"));
  EXPECT_THAT(log, HasSubstr("FAIL: TCP connects but gRPC does not answer"));
  EXPECT_THAT(log, HasSubstr("needs --tls_cert/--tls_key signed by it"));
}

}  // namespace
}  // namespace ps
