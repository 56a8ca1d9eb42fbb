// Compose: deploy/compose/compose.yaml brought up by podman-compose with the
// images deploy/images/build.sh makes (two server shards, two workers, the
// pki service making the job's CA, certificates and token). Its running
// servers refuse a plaintext client and a TLS client without a certificate
// and admit one with a certificate of the job's CA; then the job trains
// LeNet on Fashion-MNIST for one epoch over mutual TLS and reaches the test
// accuracy of the same job run as plain processes (within 0.01; synchronous
// training makes them equal), and is torn down with its volumes.
//
// Tagged "container": it needs the images (deploy/test.sh builds them
// before `bazel test //...`) and about two minutes.
//
//   bash deploy/images/build.sh --no-gpu
//   bazel test //tests:compose_test
//
// compose_config_test, which runs everywhere, checks the file itself.

#include <unistd.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/testing/subprocess.h"
#include "tests/containers.h"
#include "tests/json_file.h"
#include "tests/process.h"

namespace ps {
namespace {

using ::testing::HasSubstr;
using testing::RunCommand;
using testing::RunfilePath;
using testing::ShellQuote;
using testing::TestTmpPath;
using tests::Process;
using tests::RunWithPodman;
using tests::WaitForPortFile;

// The job both runs train; the compose side reads it from its .env.
constexpr int kWorkers = 2;
constexpr int kShards = 2;

// The shipped .env with `overrides` (NAME=value lines) replacing its values.
std::string JobFile(const std::vector<std::string>& overrides) {
  std::istringstream shipped(testing::ReadFileBytes(RunfilePath("deploy/compose/.env")));
  std::string out, line;
  while (std::getline(shipped, line)) {
    bool replaced = false;
    for (const std::string& o : overrides) {
      const std::string name = o.substr(0, o.find('=') + 1);
      if (absl::StartsWith(line, name)) replaced = true;
    }
    if (!replaced) absl::StrAppend(&out, line, "\n");
  }
  for (const std::string& o : overrides) absl::StrAppend(&out, o, "\n");
  return out;
}

// Brings a project up and always takes it down (volumes too), printing the
// containers' logs when the test failed.
class ComposeProject {
 public:
  ComposeProject(std::string dir, std::string name) : dir_(std::move(dir)), name_(std::move(name)) {}
  ~ComposeProject() {
    std::string output;
    if (::testing::Test::HasFailure()) {
      RunWithPodman("podman ps -a --filter label=com.docker.compose.project=" + name_ +
                 " --format '{{.Names}} {{.Status}}'",
             &output);
      std::cerr << output;
      for (const std::string& c : Containers("")) {
        RunWithPodman("podman logs " + c + " 2>&1 | tail -30", &output);
        std::cerr << "--- " << c << " ---\n" << output;
      }
    }
    Compose("down -v", &output);
    // podman-compose 1.0.3's down leaves the project's network behind.
    RunWithPodman("podman network rm -f " + name_ + "_default", &output);
  }
  const std::string& name() const { return name_; }
  int Compose(const std::string& args, std::string* output) {
    return RunWithPodman(
        "cd " + ShellQuote(dir_) + " && podman-compose -p " + name_ + " " + args + " 2>&1", output);
  }
  // The project's containers of `service` ("" : all), by name.
  std::vector<std::string> Containers(const std::string& service) {
    std::string filter = "--filter label=com.docker.compose.project=" + name_;
    if (!service.empty()) filter += " --filter label=com.docker.compose.service=" + service;
    std::string output;
    RunWithPodman("podman ps -a " + filter + " --format '{{.Names}}'", &output);
    return absl::StrSplit(output, '\n', absl::SkipWhitespace());
  }

 private:
  std::string dir_;
  std::string name_;
};

double ReportedAccuracy(const std::string& path) {
  const nlohmann::json report = tests::ReadJsonFile(path);
  return report.is_object() ? report.value("final_test_accuracy", -1.0) : -1.0;
}

// The same job as processes on this machine: two shards, two workers; with
// `weights` set, worker r saves its final weights to weights + "-r.safetensors".
double AccuracyOutsideContainers(const std::string& weights = "") {
  std::vector<std::unique_ptr<Process>> servers;
  std::vector<std::string> addresses;
  for (int s = 0; s < kShards; ++s) {
    const std::string port_file = TestTmpPath(absl::StrCat("outside-server-", s, ".port"));
    servers.push_back(std::make_unique<Process>(
        RunfilePath("server/server"),
        std::vector<std::string>{"--port=0", "--port_file=" + port_file,
                                 absl::StrCat("--num_workers=", kWorkers), "--lr=0.1",
                                 "--momentum=0.9", "--weight_decay=0"},
        TestTmpPath(absl::StrCat("outside-server-", s, ".log"))));
    const int port = WaitForPortFile(port_file);
    EXPECT_GT(port, 0) << servers.back()->Log();
    addresses.push_back(absl::StrCat("127.0.0.1:", port));
  }
  std::vector<std::unique_ptr<Process>> workers;
  for (int r = 0; r < kWorkers; ++r) {
    workers.push_back(std::make_unique<Process>(
        RunfilePath("worker/worker"),
        std::vector<std::string>{
            "--server=" + absl::StrJoin(addresses, ","), absl::StrCat("--worker_id=outside-", r),
            absl::StrCat("--rank=", r),
            "--model=lenet", "--dataset=fashion_mnist",
            "--data_dir=/usr/share/datasets/fashion-mnist", "--epochs=1", "--batch_size=256",
            "--seed=0", "--devices=cpu", "--threads=1", "--progress=false",
            "--report=" + TestTmpPath(absl::StrCat("outside-", r, ".json")),
            weights.empty() ? "--progress=false"
                            : absl::StrCat("--save_weights=", weights, "-", r, ".safetensors")},
        TestTmpPath(absl::StrCat("outside-worker-", r, ".log"))));
  }
  for (auto& w : workers) EXPECT_EQ(w->Wait(std::chrono::seconds(600)), 0) << w->Log();
  return ReportedAccuracy(TestTmpPath("outside-0.json"));
}

TEST(ComposeTest, TrainsLeNetForOneEpochLikeTheSameJobOutsideContainers) {
  ASSERT_TRUE(tests::ImagesBuilt({"localhost/ps-server:latest", "localhost/ps-worker:latest"}));
  std::string output;

  // The project: the shipped compose.yaml and its .env, the job cut to one
  // epoch and one thread per worker (two workers share this machine's two
  // cores), the reports in a folder this test reads.
  const std::string dir = TestTmpPath("project");
  const std::string reports = TestTmpPath("reports");
  ASSERT_EQ(RunCommand("mkdir -p " + dir + " " + reports + " && chmod 777 " + reports +
                           " && cp " + ShellQuote(RunfilePath("deploy/compose/compose.yaml")) +
                           " " + dir,
                       &output),
            0)
      << output;
  std::ofstream(dir + "/.env")
      << JobFile({absl::StrCat("NUM_WORKERS=", kWorkers), "EPOCHS=1", "THREADS=1",
                  "PS_REPORTS=" + reports});

  const auto start = std::chrono::steady_clock::now();
  ComposeProject project(dir, absl::StrCat("pscompose", getpid()));
  ASSERT_EQ(project.Compose("up -d", &output), 0) << output;
  const std::string up_output = output;
  std::vector<std::string> workers;
  for (int r = 0; r < kWorkers; ++r) {
    for (const std::string& w : project.Containers(absl::StrCat("worker-", r))) workers.push_back(w);
  }
  ASSERT_EQ(workers.size(), kWorkers) << output;
  // The shards, the workers and the pki service that made their identities.
  ASSERT_EQ(project.Containers("").size(), kWorkers + kShards + 1);

  // From inside shard 0's container, with its files, to shard 1 over the
  // project's network: a client with the job CA's certificate is admitted
  // (retried until the shard serves), one in plaintext and one over TLS
  // without a certificate are not (ps-health: 0 serving, 2 not reached).
  const std::vector<std::string> server0 = project.Containers("server-0");
  ASSERT_EQ(server0.size(), 1u);
  const std::string health = "podman exec " + server0[0] +
                             " /usr/local/bin/ps-health --address=server-1:50051 --timeout=3s";
  const std::string tls_ca = " --tls_ca=/etc/ps/tls/ca.crt --tls_server_name=server-1";
  const std::string client_cert = " --tls_cert=/etc/ps/tls/tls.crt --tls_key=/etc/ps/tls/tls.key";
  int admitted = -1;
  for (int attempt = 0; attempt < 60 && admitted != 0; ++attempt) {
    admitted = RunWithPodman(health + tls_ca + client_cert + " 2>&1", &output);
    if (admitted != 0) sleep(1);
  }
  ASSERT_EQ(admitted, 0) << output;
  EXPECT_EQ(RunWithPodman(health + " 2>&1", &output), 2) << "plaintext: " << output;
  EXPECT_EQ(RunWithPodman(health + tls_ca + " 2>&1", &output), 2) << "no certificate: " << output;
  for (const std::string& w : workers) {
    ASSERT_EQ(RunWithPodman("timeout 600 podman wait " + w, &output), 0) << output;
    EXPECT_EQ(std::string(absl::StripAsciiWhitespace(output)), "0")
        << w << " exited " << output << "\n" << up_output;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  // Both shards are still up and healthy by gRPC's health service, as the
  // compose file's check asks it (run by hand: podman schedules health
  // checks with systemd timers, and these machines run no systemd).
  for (const char* service : {"server-0", "server-1"}) {
    for (const std::string& s : project.Containers(service)) {
      EXPECT_EQ(RunWithPodman("podman healthcheck run " + s, &output), 0) << s << ": " << output;
    }
  }

  // Each daemon's identity volume holds its own certificate, named after it
  // (a worker's CN and only SAN are its --worker_id), its key readable by
  // the daemons' user alone, and the token.
  for (const char* id : {"w0", "w1", "server-0", "server-1"}) {
    const std::string volume = absl::StrCat(project.name(), "_pki-", id);
    ASSERT_EQ(RunWithPodman("podman run --rm --entrypoint /bin/sh -v " + volume +
                                ":/id:ro localhost/ps-server:latest -c 'openssl x509 -in "
                                "/id/tls.crt -noout -subject -ext subjectAltName && stat -c "
                                "\"%a %u %n\" /id/tls.key /id/token && ls /id' 2>&1",
                            &output),
              0)
        << volume << ": " << output;
    EXPECT_THAT(output, HasSubstr(absl::StrCat("CN = ", id, "\n")));
    EXPECT_THAT(output, HasSubstr(absl::StrCat("DNS:", id)));
    EXPECT_THAT(output, HasSubstr("600 10001 /id/tls.key"));
    EXPECT_THAT(output, HasSubstr("600 10001 /id/token"));
    EXPECT_THAT(output, HasSubstr("ca.crt\ntls.crt\ntls.key\ntoken\n")) << volume;
  }

  // Every worker wrote its report (named after its id), all with
  // the same parameters and so the same accuracy.
  std::vector<double> inside;
  RunCommand("ls " + reports, &output);
  for (absl::string_view name : absl::StrSplit(output, '\n', absl::SkipWhitespace())) {
    inside.push_back(ReportedAccuracy(absl::StrCat(reports, "/", name)));
  }
  ASSERT_EQ(inside.size(), kWorkers) << output;
  EXPECT_EQ(inside[0], inside[1]);
  // LeNet (sigmoid, as d2l's) after one epoch: about 0.4; chance is 0.1.
  EXPECT_GT(inside[0], 0.25);

  const double outside = AccuracyOutsideContainers();
  EXPECT_NEAR(inside[0], outside, 0.01);
  std::cout << "compose: " << kShards << " shards, " << kWorkers << " workers, one LeNet epoch in "
            << seconds << " s; test accuracy " << inside[0] << " in containers, " << outside
            << " outside\n";
}

// A shard's container killed (SIGKILL) midway is restarted by its restart
// policy, resumes from its checkpoint volume, the workers reconnect, and the
// job ends with weights bit-identical to the same job outside containers.
//
// Needs shard failover (workers recovering from a lost shard of several),
// which is being built: until it lands this test fails, so its target
// //tests:compose_failover_test is tagged "manual" (not in `bazel test
// //...`); run it by name. Drop "manual" when failover is merged.
TEST(ComposeTest, AShardKilledMidwayIsRestartedAndTheJobEndsBitIdentical) {
  ASSERT_TRUE(tests::ImagesBuilt({"localhost/ps-server:latest", "localhost/ps-worker:latest"}));
  std::string output;
  const std::string dir = TestTmpPath("failover-project");
  const std::string reports = TestTmpPath("failover-reports");
  ASSERT_EQ(RunCommand("mkdir -p " + dir + " " + reports + " && chmod 777 " + reports, &output), 0)
      << output;
  // The shipped file, each worker also saving its final weights.
  std::string compose = testing::ReadFileBytes(RunfilePath("deploy/compose/compose.yaml"));
  for (const char* id : {"w0", "w1"}) {
    const std::string report = absl::StrCat("--report=/var/lib/ps/reports/", id, ".json");
    const size_t at = compose.find(report);
    ASSERT_NE(at, std::string::npos) << report;
    compose.insert(at + report.size(),
                   absl::StrCat(", --save_weights=/var/lib/ps/reports/", id, ".safetensors"));
  }
  std::ofstream(dir + "/compose.yaml") << compose;
  std::ofstream(dir + "/.env") << JobFile({absl::StrCat("NUM_WORKERS=", kWorkers), "EPOCHS=1",
                                           "THREADS=1", "CHECKPOINT_EVERY_STEPS=20",
                                           "PS_REPORTS=" + reports});

  ComposeProject project(dir, absl::StrCat("psfailover", getpid()));
  ASSERT_EQ(project.Compose("up -d", &output), 0) << output;
  const std::vector<std::string> shard = project.Containers("server-1");
  ASSERT_EQ(shard.size(), 1u);
  // Killed once it has a checkpoint to resume from.
  bool checkpointed = false;
  for (int i = 0; i < 300 && !checkpointed; ++i) {
    checkpointed = RunWithPodman("podman exec " + shard[0] +
                                     " sh -c 'ls /var/lib/ps/checkpoints | grep -q .'",
                                 &output) == 0;
    if (!checkpointed) sleep(1);
  }
  ASSERT_TRUE(checkpointed) << "server-1 wrote no checkpoint";
  // SIGKILL from outside, as a crash: `podman kill` would count as stopped
  // by the user, which no restart policy restarts.
  ASSERT_EQ(RunWithPodman("kill -KILL $(podman inspect --format '{{.State.Pid}}' " + shard[0] + ")",
                          &output),
            0)
      << output;

  for (int r = 0; r < kWorkers; ++r) {
    for (const std::string& w : project.Containers(absl::StrCat("worker-", r))) {
      ASSERT_EQ(RunWithPodman("timeout 600 podman wait " + w, &output), 0) << output;
      EXPECT_EQ(std::string(absl::StripAsciiWhitespace(output)), "0") << w;
    }
  }
  RunWithPodman("podman inspect --format '{{.RestartCount}}' " + shard[0], &output);
  EXPECT_NE(absl::StripAsciiWhitespace(output), "0") << "server-1 was not restarted";

  AccuracyOutsideContainers(TestTmpPath("failover-outside"));
  for (int r = 0; r < kWorkers; ++r) {
    const std::string inside = testing::ReadFileBytes(absl::StrCat(reports, "/w", r, ".safetensors"));
    ASSERT_FALSE(inside.empty());
    EXPECT_TRUE(inside == testing::ReadFileBytes(
                              absl::StrCat(TestTmpPath("failover-outside"), "-", r, ".safetensors")))
        << "worker " << r << "'s final weights differ from the job outside containers";
  }
}

}  // namespace
}  // namespace ps
