// The Kubernetes manifests' containers for real, without a cluster: the cpu
// overlay's StatefulSets become pods (deploy/k8s/kube_play.py, which says
// what podman cannot do as a kubelet would) that `podman kube play` runs on
// one network: two server shards and two workers, each worker's rank from
// its pod name, the job from the ConfigMap, mutual TLS and the token from
// the Secrets deploy/k8s/make_secrets.sh makes (each pod mounting only its
// own key), read-only root filesystems, user 10001. The workers wait for the
// shards' health over mutual TLS in their init container, train LeNet for
// one epoch, agree on the accuracy, and idle; the servers stay healthy by
// the probes' command and refuse a plaintext client.
//
// Tagged "container": it needs the images (deploy/test.sh builds them
// before `bazel test //...`).
//
//   bash deploy/images/build.sh --no-gpu
//   bazel test //tests:k8s_play_test

#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/testing/subprocess.h"
#include "tests/containers.h"

namespace ps {
namespace {

using ::testing::HasSubstr;
using testing::RunCommand;
using testing::RunfilePath;
using testing::ShellQuote;
using testing::TestTmpPath;

constexpr int kServers = 2;
constexpr int kWorkers = 2;

// `command` with its stderr, given 300 s at most (a pod that never starts
// must not hang the test).
int Podman(const std::string& command, std::string* output) {
  return tests::RunWithPodman("timeout 300 " + command + " 2>&1", output);
}

// Plays the pods on their own network; removes pods and network at the end,
// printing the containers' logs when the test failed.
class PlayedJob {
 public:
  PlayedJob(std::string dir, std::string network) : dir_(std::move(dir)), network_(std::move(network)) {}
  ~PlayedJob() {
    std::string output;
    for (const std::string& pod : pods_) {
      if (::testing::Test::HasFailure()) {
        Podman("podman pod logs " + pod + " | tail -20", &output);
        std::cerr << "--- " << pod << " ---\n" << output;
      }
      Podman("podman kube down " + ShellQuote(dir_ + "/" + pod + ".yaml"), &output);
    }
    Podman("podman network rm -f " + network_, &output);
    Podman("podman volume ls -q --filter name=" + network_ + "- | xargs -r podman volume rm -f",
           &output);
  }
  int Play(const std::string& pod, std::string* output) {
    pods_.push_back(pod);
    return Podman("podman kube play --network " + network_ + " " +
                      ShellQuote(dir_ + "/" + pod + ".yaml"),
                  output);
  }

 private:
  std::string dir_;
  std::string network_;
  std::vector<std::string> pods_;
};

// Waits until `container`'s log holds `text`; the log, or "" on timeout.
std::string WaitForLog(const std::string& container, const std::string& text,
                       std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string log;
  while (std::chrono::steady_clock::now() < deadline) {
    Podman("podman logs " + container, &log);
    if (log.find(text) != std::string::npos) return log;
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  std::cerr << container << " never logged \"" << text << "\"; its log:\n" << log;
  return "";
}

// The accuracy in "worker R: final test accuracy A, ..."; -1 if absent.
double FinalAccuracy(const std::string& log) {
  const std::string key = "final test accuracy ";
  const size_t at = log.find(key);
  if (at == std::string::npos) return -1;
  double accuracy = -1;
  const size_t start = at + key.size();
  return absl::SimpleAtod(log.substr(start, log.find(',', start) - start), &accuracy) ? accuracy
                                                                                      : -1;
}

TEST(K8sPlayTest, TheCpuOverlaysContainersTrainLeNetInPods) {
  ASSERT_TRUE(tests::ImagesBuilt({"localhost/ps-server:latest", "localhost/ps-worker:latest"}));
  std::string output;
  const std::string pods = TestTmpPath("pods");
  const std::string pki = TestTmpPath("pki");
  ASSERT_EQ(RunCommand(absl::StrCat("bash ", ShellQuote(RunfilePath("deploy/k8s/make_secrets.sh")),
                                    " ", pki, " --servers=", kServers, " --workers=", kWorkers,
                                    " 2>&1"),
                       &output),
            0)
      << output;
  const std::string network = absl::StrCat("psk8s", getpid());
  ASSERT_EQ(RunCommand(absl::StrCat("python3 ", ShellQuote(RunfilePath("deploy/k8s/kube_play.py")),
                                    " ", ShellQuote(RunfilePath("deploy/k8s/overlays/cpu")), " ",
                                    pods, " --servers=", kServers, " --workers=", kWorkers,
                                    " --secrets=", pki, "/secrets.yaml --volume_prefix=", network,
                                    // One epoch; the optimizer of compose_test (d2l's lr 0.9
                                    // without momentum is still at chance after one epoch).
                                    " --set EPOCHS=1 --set WORKER_THREADS=1",
                                    " --set LR=0.1 --set MOMENTUM=0.9 2>&1"),
                       &output),
            0)
      << output;

  ASSERT_EQ(Podman("podman network create " + network, &output), 0) << output;
  PlayedJob job(pods, network);
  // Shards first: `podman kube play` returns only once a pod's init
  // containers are done, and the workers' wait for the shards' health.
  for (int s = 0; s < kServers; ++s) {
    ASSERT_EQ(job.Play(absl::StrCat("ps-server-", s), &output), 0) << output;
  }
  for (int r = 0; r < kWorkers; ++r) {
    ASSERT_EQ(job.Play(absl::StrCat("ps-worker-", r), &output), 0) << output;
  }

  std::vector<double> accuracy;
  for (int r = 0; r < kWorkers; ++r) {
    const std::string log = WaitForLog(absl::StrCat("ps-worker-", r, "-worker"),
                                       "training finished; idling", std::chrono::seconds(300));
    ASSERT_FALSE(log.empty());
    // The rank came from the pod's name.
    EXPECT_THAT(log, HasSubstr(absl::StrCat("worker ", r, "/", kWorkers, ": training")));
    accuracy.push_back(FinalAccuracy(log));
  }
  EXPECT_EQ(accuracy[0], accuracy[1]);
  // LeNet after one epoch: about 0.4 (compose_test); chance is 0.1.
  EXPECT_GT(accuracy[0], 0.25);

  for (int s = 0; s < kServers; ++s) {
    const std::string server = absl::StrCat("ps-server-", s, "-server");
    // The probes' command (exec: ps-health over mutual TLS) says SERVING;
    // a plaintext client is not served (2: not reached).
    const std::string health = "podman exec " + server + " ps-health --address=127.0.0.1:50051";
    EXPECT_EQ(Podman(health +
                         " --tls_ca=/etc/ps/tls/ca.crt --tls_cert=/etc/ps/tls/tls.crt"
                         " --tls_key=/etc/ps/tls/tls.key --tls_server_name=localhost",
                     &output),
              0)
        << output;
    EXPECT_EQ(Podman(health, &output), 2) << output;
    // Each shard sees only its own key.
    Podman("podman exec " + server + " ls /etc/ps/tls", &output);
    EXPECT_EQ(output, "ca.crt\ntls.crt\ntls.key\n");
    // The security context holds: user 10001, nothing writable outside the
    // volumes.
    Podman("podman exec " + server + " id -u", &output);
    EXPECT_EQ(absl::StripAsciiWhitespace(output), "10001");
    EXPECT_NE(Podman("podman exec " + server + " touch /usr/local/bin/x", &output), 0) << output;
  }
  std::cout << "kube play: " << kServers << " shards, " << kWorkers
            << " workers, one LeNet epoch: test accuracy " << accuracy[0] << "\n";
}

}  // namespace
}  // namespace ps
