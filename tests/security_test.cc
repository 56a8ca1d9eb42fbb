// The daemons' security end to end: a server with mutual TLS and a job token
// trains with the job's two workers and refuses every other kind of client,
// each within a bounded time, while they train; a server on a non-loopback
// address refuses to serve plaintext unless told --insecure.

#include <signal.h>
#include <stdlib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/testing/subprocess.h"
#include "tests/process.h"

namespace ps {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using tests::Process;
using tests::WaitForLog;
using tests::WaitForPortFile;

constexpr char kToken[] = "security-test-job-token-0123456789";

// Writes `contents` to `name` in the test's directory, readable by its owner
// only (as a secret should be); returns the path.
std::string WriteSecret(const std::string& name, const std::string& contents) {
  const std::string path = testing::TestTmpPath(name);
  std::ofstream(path) << contents;
  chmod(path.c_str(), 0600);
  return path;
}

// A throwaway PKI (deploy/tls/make_test_certs.sh) in the test's directory.
std::string MakeCerts() {
  const std::string dir = testing::TestTmpPath("certs");
  std::string output;
  const int rc = testing::RunCommand(
      absl::StrCat(testing::ShellQuote(testing::RunfilePath("deploy/tls/make_test_certs.sh")),
                   " ", testing::ShellQuote(dir)),
      &output);
  EXPECT_EQ(rc, 0) << output;
  return dir;
}

// A loopback port free now (bound to port 0, then closed).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  const bool bound = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
                     getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  close(fd);
  return bound ? ntohs(address.sin_port) : -1;
}

// ps-health against `address` in plaintext: its exit status and output.
int PlaintextHealthCheck(const std::string& address, std::string* output) {
  return testing::RunCommand(
      absl::StrCat(testing::ShellQuote(testing::RunfilePath("server/health_check")),
                   " --address=", address, " --timeout=5s"),
      output);
}

// Worker arguments that keep a training run to a few seconds on one core.
std::vector<std::string> WorkerArgs(const std::string& address, const std::string& id) {
  return {"--server=" + address, "--worker_id=" + id, "--model=mlp", "--mlp_hidden=32",
          "--dataset=synthetic", "--batch_size=64", "--max_steps=20", "--epochs=1",
          "--evaluate=false", "--progress=false", "--devices=cpu", "--threads=1"};
}

// A worker that must be refused, waited for on its own thread so that all of
// them run at once and each one's exit is timed.
struct Refused {
  std::string name;
  std::vector<std::string> flags;
  std::unique_ptr<Process> process;
  std::thread waiter;
  int exit_code = -1;
  double seconds = 0;
};

TEST(SecurityTest, MutualTlsAndAJobTokenAdmitTheJobsWorkersAndRefuseEveryOtherClient) {
  unsetenv("PS_JOB_TOKEN");  // the refused workers must not find one there
  const std::string certs = MakeCerts();
  const std::string ca = certs + "/ca.pem";
  // Each worker's own certificate (CN = SAN = its id), and one of no
  // worker's (CN "worker") for the calls refused before registering.
  auto cert_of = [&](const std::string& name) {
    return std::vector<std::string>{"--tls_cert=" + certs + "/" + name + ".pem",
                                    "--tls_key=" + certs + "/" + name + ".key"};
  };
  const std::vector<std::string> client_cert = cert_of("worker");
  const std::string token_file = WriteSecret("token", absl::StrCat(kToken, "\n"));
  const std::string wrong_token_file =
      WriteSecret("wrong-token", "security-test-job-token-0123456789-not-it\n");
  const std::string port_file = testing::TestTmpPath("port");
  const int health_port = FreePort();
  ASSERT_GT(health_port, 0);
  Process server(testing::RunfilePath("server/server"),
                 {"--port=0", "--port_file=" + port_file, "--num_workers=2", "--lr=0.1",
                  "--tls_cert=" + certs + "/server.pem", "--tls_key=" + certs + "/server.key",
                  "--tls_client_ca=" + ca, "--job_token_file=" + token_file,
                  absl::StrCat("--health_port=", health_port)},
                 testing::TestTmpPath("server.log"));
  const int port = WaitForPortFile(port_file);
  ASSERT_GT(port, 0) << server.Log();
  const std::string address = absl::StrCat("127.0.0.1:", port);
  EXPECT_THAT(server.Log(), HasSubstr("mutual TLS, job token required")) << server.Log();

  // 0. Probes that cannot speak TLS (the kubelet's) ask the health port in
  //    plaintext: serving. The job port itself does not answer them.
  std::string health;
  EXPECT_EQ(PlaintextHealthCheck(absl::StrCat("127.0.0.1:", health_port), &health), 0) << health;
  EXPECT_THAT(health, HasSubstr("SERVING"));
  EXPECT_EQ(PlaintextHealthCheck(address, &health), 2) << health;

  // 1. The job's two workers: one reads the token from a file, the other
  //    from $PS_JOB_TOKEN.
  std::vector<std::unique_ptr<Process>> workers;
  for (int r = 0; r < 2; ++r) {
    std::vector<std::string> args = WorkerArgs(address, absl::StrCat("w", r));
    args.push_back(absl::StrCat("--rank=", r));
    args.push_back("--tls_ca=" + ca);
    const std::vector<std::string> own = cert_of(absl::StrCat("w", r));
    args.insert(args.end(), own.begin(), own.end());
    if (r == 0) args.push_back("--job_token_file=" + token_file);
    if (r == 1) setenv("PS_JOB_TOKEN", kToken, /*overwrite=*/1);
    workers.push_back(std::make_unique<Process>(
        testing::RunfilePath("worker/worker"), args,
        testing::TestTmpPath(absl::StrCat("worker", r, ".log"))));
    unsetenv("PS_JOB_TOKEN");
  }

  // 2. Meanwhile every kind of stranger, all at once.
  const std::vector<std::pair<std::string, std::vector<std::string>>> strangers = {
      {"plaintext", {"--job_token_file=" + token_file}},
      {"no_client_cert", {"--tls_ca=" + ca, "--job_token_file=" + token_file}},
      {"other_ca_cert",
       {"--tls_ca=" + ca, "--tls_cert=" + certs + "/other-worker.pem",
        "--tls_key=" + certs + "/other-worker.key", "--job_token_file=" + token_file}},
      {"wrong_token", {"--tls_ca=" + ca, client_cert[0], client_cert[1],
                       "--job_token_file=" + wrong_token_file}},
      {"no_token", {"--tls_ca=" + ca, client_cert[0], client_cert[1]}},
      // The right CA and token, but a certificate that does not name w0:
      // w1's, and one of no worker's.
      {"w1_cert_as_w0", {"--worker_id=w0", "--tls_ca=" + ca, cert_of("w1")[0], cert_of("w1")[1],
                         "--job_token_file=" + token_file}},
      {"worker_cert_as_w0", {"--worker_id=w0", "--tls_ca=" + ca, client_cert[0], client_cert[1],
                             "--job_token_file=" + token_file}},
  };
  // Sized once: the waiters hold references into it.
  std::vector<Refused> refused(strangers.size());
  for (size_t i = 0; i < strangers.size(); ++i) {
    refused[i].name = strangers[i].first;
    refused[i].flags = strangers[i].second;
  }
  for (Refused& r : refused) {
    std::vector<std::string> args = WorkerArgs(address, r.name);
    args.insert(args.end(), r.flags.begin(), r.flags.end());
    args.push_back("--connect_timeout=15s");
    r.process = std::make_unique<Process>(testing::RunfilePath("worker/worker"), args,
                                          testing::TestTmpPath(r.name + ".log"));
    r.waiter = std::thread([&r] {
      const auto start = std::chrono::steady_clock::now();
      r.exit_code = r.process->Wait(std::chrono::seconds(120));
      r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    });
  }

  // 3. The job's workers train to the end, the strangers notwithstanding.
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(workers[r]->Wait(std::chrono::seconds(120)), 0) << workers[r]->Log();
    EXPECT_THAT(workers[r]->Log(), HasSubstr(absl::StrCat("worker ", r, "/2: training")));
    EXPECT_THAT(workers[r]->Log(), HasSubstr("pushed 101800 and pulled 101800 bytes per step"));
  }

  // 4. Every stranger fails to register and exits non-zero. A wrong or
  //    missing token is refused at once, UNAUTHENTICATED and named in the
  //    worker's log. A failed handshake never reaches the service, and the
  //    worker's gRPC status does not say why (the server closed the
  //    connection: "Deadline Exceeded" or "tcp handshaker shutdown"): the
  //    worker tries until its --connect_timeout (15 s here).
  //    The reason is in the server's log, one line per handshake tried.
  for (Refused& r : refused) {
    r.waiter.join();
    const std::string log = r.process->Log();
    std::printf("%s: exit %d after %.1f s: %s", r.name.c_str(), r.exit_code, r.seconds,
                log.substr(log.rfind('\n', log.size() - 2) + 1).c_str());
    // -1 before the 120 s wait is up: killed by a signal, i.e. it crashed.
    EXPECT_GT(r.exit_code, 0) << r.name << (r.exit_code < 0 && r.seconds < 119 ? " crashed" : "")
                              << ": " << log;
    EXPECT_LT(r.seconds, 45) << r.name;
    EXPECT_THAT(log, HasSubstr("Register with " + address)) << r.name;
    EXPECT_THAT(log, Not(HasSubstr("training"))) << r.name;
  }
  EXPECT_THAT(refused[3].process->Log(), HasSubstr("UNAUTHENTICATED"));
  EXPECT_THAT(refused[3].process->Log(), HasSubstr("wrong job token"));
  EXPECT_THAT(refused[4].process->Log(), HasSubstr("UNAUTHENTICATED"));
  EXPECT_THAT(refused[4].process->Log(), HasSubstr("this server needs the job token"));
  EXPECT_LT(refused[3].seconds, 30);
  EXPECT_LT(refused[4].seconds, 30);
  // A certificate that does not name the id is refused at once, naming
  // both (and w0, training meanwhile, is untouched: step 3 above).
  for (int i : {5, 6}) {
    const std::string log = refused[i].process->Log();
    EXPECT_THAT(log, HasSubstr("PERMISSION_DENIED")) << refused[i].name;
    EXPECT_THAT(log, HasSubstr("worker 'w0' must present a client certificate whose CN or "
                               "subjectAltName is its id"))
        << refused[i].name;
    EXPECT_LT(refused[i].seconds, 30) << refused[i].name;
  }
  EXPECT_THAT(refused[5].process->Log(), HasSubstr("this one names CN 'w1', SAN 'w1'"));
  EXPECT_THAT(refused[6].process->Log(), HasSubstr("this one names CN 'worker'"));
  const std::string server_log = server.Log();
  EXPECT_THAT(server_log, HasSubstr("wrong version number"));               // plaintext
  EXPECT_THAT(server_log, HasSubstr("peer did not return a certificate"));  // no client cert
  EXPECT_THAT(server_log, HasSubstr("certificate verify failed"));          // other CA's

  server.Signal(SIGTERM);
  EXPECT_EQ(server.Wait(std::chrono::seconds(20)), 0) << server_log;
  EXPECT_THAT(server.Log(), HasSubstr("stopping at version 20"));
}

// Token only (no client certificates): anyone holding the token can name
// any worker id, so a registration naming a live worker's id must prove it
// is that worker (its --identity_file). A stranger with the token and w0's
// id is refused ALREADY_EXISTS, waits for the liveness bound within its
// --connect_timeout saying so, and gives up; both real workers train to
// the end.
TEST(SecurityTest, WithTheTokenOnlyALiveWorkersIdCannotBeTaken) {
  unsetenv("PS_JOB_TOKEN");
  const std::string token_file = WriteSecret("token-only", absl::StrCat(kToken, "\n"));
  const std::string port_file = testing::TestTmpPath("token-only.port");
  Process server(testing::RunfilePath("server/server"),
                 {"--port=0", "--port_file=" + port_file, "--num_workers=2", "--lr=0.1",
                  "--job_token_file=" + token_file},
                 testing::TestTmpPath("token-only.server.log"));
  const int port = WaitForPortFile(port_file);
  ASSERT_GT(port, 0) << server.Log();
  const std::string address = absl::StrCat("127.0.0.1:", port);
  std::vector<std::unique_ptr<Process>> workers;
  for (int r = 0; r < 2; ++r) {
    std::vector<std::string> args = WorkerArgs(address, absl::StrCat("w", r));
    args.push_back(absl::StrCat("--rank=", r));
    args.push_back("--job_token_file=" + token_file);
    args.push_back("--identity_file=" + testing::TestTmpPath(absl::StrCat("w", r, ".identity")));
    args.push_back("--max_steps=200");  // still training when the stranger comes
    args.push_back("--epochs=2");       // of 128 steps each
    workers.push_back(std::make_unique<Process>(
        testing::RunfilePath("worker/worker"), args,
        testing::TestTmpPath(absl::StrCat("token-only.worker", r, ".log"))));
  }
  ASSERT_TRUE(WaitForLog(*workers[0], "worker 0/2: training", std::chrono::seconds(60)))
      << workers[0]->Log();
  std::vector<std::string> args = WorkerArgs(address, "w0");
  args.push_back("--job_token_file=" + token_file);
  args.push_back("--connect_timeout=2s");  // gives up before the 10 s bound
  Process stranger(testing::RunfilePath("worker/worker"), args,
                   testing::TestTmpPath("token-only.stranger.log"));
  EXPECT_GT(stranger.Wait(std::chrono::seconds(60)), 0) << stranger.Log();
  const std::string log = stranger.Log();
  EXPECT_THAT(log, HasSubstr("to declare worker id 'w0''s holder lost"));
  EXPECT_THAT(log, HasSubstr("worker 'w0' is live: rank 0's holder was heard "));
  EXPECT_THAT(log, HasSubstr("ALREADY_EXISTS: worker id 'w0' stayed live"));
  EXPECT_THAT(log, Not(HasSubstr("training")));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(workers[r]->Wait(std::chrono::seconds(120)), 0) << workers[r]->Log();
  }
  server.Signal(SIGTERM);
  EXPECT_EQ(server.Wait(std::chrono::seconds(20)), 0) << server.Log();
  EXPECT_THAT(server.Log(), HasSubstr("stopping at version 200"));
}

TEST(SecurityTest, PlaintextOnANonLoopbackAddressNeedsInsecure) {
  const std::string server_binary = testing::RunfilePath("server/server");
  // Refused before it listens: no port file.
  const std::string refused_port = testing::TestTmpPath("refused.port");
  Process refused(server_binary,
                  {"--bind_address=0.0.0.0", "--port=0", "--port_file=" + refused_port},
                  testing::TestTmpPath("refused.log"));
  EXPECT_EQ(refused.Wait(std::chrono::seconds(30)), 1) << refused.Log();
  EXPECT_THAT(refused.Log(), HasSubstr("refusing to serve plaintext on 0.0.0.0"));
  EXPECT_FALSE(std::ifstream(refused_port).good());

  // With --insecure it serves, and says so.
  const std::string insecure_port = testing::TestTmpPath("insecure.port");
  Process insecure(server_binary,
                   {"--bind_address=0.0.0.0", "--port=0", "--port_file=" + insecure_port,
                    "--insecure"},
                   testing::TestTmpPath("insecure.log"));
  ASSERT_GT(WaitForPortFile(insecure_port), 0) << insecure.Log();
  EXPECT_THAT(insecure.Log(), HasSubstr("INSECURE plaintext (--insecure)"));
  insecure.Signal(SIGTERM);
  EXPECT_EQ(insecure.Wait(std::chrono::seconds(20)), 0) << insecure.Log();

  // TLS on the same address needs no --insecure.
  const std::string certs = MakeCerts();
  const std::string tls_port = testing::TestTmpPath("tls.port");
  Process tls(server_binary,
              {"--bind_address=0.0.0.0", "--port=0", "--port_file=" + tls_port,
               "--tls_cert=" + certs + "/server.pem", "--tls_key=" + certs + "/server.key"},
              testing::TestTmpPath("tls.log"));
  ASSERT_GT(WaitForPortFile(tls_port), 0) << tls.Log();
  EXPECT_THAT(tls.Log(), HasSubstr(", TLS, "));
  tls.Signal(SIGTERM);
  EXPECT_EQ(tls.Wait(std::chrono::seconds(20)), 0) << tls.Log();
}

}  // namespace
}  // namespace ps
