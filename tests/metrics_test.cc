// The daemons' Prometheus metrics, read back through a real Prometheus
// (Debian's prometheus package) scraping a 2-worker LeNet job: from the
// server, the live workers, the bytes of the pushes it summed, the calls
// answered by method and code and the workers' phases their heartbeats
// report; from each worker's own endpoint (a CUDA-linking binary in the
// default build: common/thread_stack.h), its step-phase histograms, steps,
// samples, version and bytes pushed.

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/subprocess.h"
#include "gtest/gtest.h"
#include "tests/process.h"

namespace ps {
namespace {

using tests::Process;
using tests::WaitForLog;
using tests::WaitForPortFile;

// A loopback port free now (Prometheus takes a fixed one).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// The value of Prometheus's instant query `query` (the first series), or
// -1 when it has none yet.
double Query(const std::string& python, int port, const std::string& query) {
  const std::string program = absl::StrCat(
      "import json, sys, urllib.parse, urllib.request\n"
      "url = 'http://127.0.0.1:", port, "/api/v1/query?' + urllib.parse.urlencode({'query': sys.argv[1]})\n"
      "r = json.load(urllib.request.urlopen(url, timeout=5))['data']['result']\n"
      "print(r[0]['value'][1] if r else -1)\n");
  std::string output;
  if (testing::RunCommand(absl::StrCat(python, " -c ", testing::ShellQuote(program), " ",
                                       testing::ShellQuote(query)),
                          &output) != 0) {
    return -1;
  }
  return std::atof(output.c_str());
}

TEST(MetricsTest, APrometheusServerReadsTheJobBack) {
  const std::string python = testing::FindPython("json");
  ASSERT_FALSE(python.empty());
  const std::string port_file = testing::TestTmpPath("port");
  Process server(testing::RunfilePath("server/server"),
                 {"--port=0", "--port_file=" + port_file, "--num_workers=2", "--metrics_port=0"},
                 testing::TestTmpPath("server.log"));
  const int port = WaitForPortFile(port_file);
  ASSERT_GT(port, 0) << server.Log();
  std::smatch match;
  const std::string log = server.Log();
  ASSERT_TRUE(std::regex_search(log, match, std::regex("metrics at http://127.0.0.1:([0-9]+)/metrics")))
      << log;
  const std::string metrics_port = match[1];

  std::vector<std::unique_ptr<Process>> workers;
  std::vector<std::string> worker_metrics_ports;
  for (int r = 0; r < 2; ++r) {
    workers.push_back(std::make_unique<Process>(
        testing::RunfilePath("worker/worker"),
        std::vector<std::string>{absl::StrCat("--server=127.0.0.1:", port),
                                 absl::StrCat("--worker_id=w", r), absl::StrCat("--rank=", r),
                                 "--model=lenet", "--batch_size=128", "--epochs=10",
                                 "--max_steps=3000", "--devices=cpu", "--threads=1",
                                 "--evaluate=false", "--progress=false", "--metrics_port=0"},
        testing::TestTmpPath(absl::StrCat("worker", r, ".log"))));
  }
  // Each worker's own endpoint, printed before it registers.
  for (const auto& w : workers) {
    ASSERT_TRUE(WaitForLog(*w, "/metrics\n", std::chrono::seconds(30))) << w->Log();
    const std::string worker_log = w->Log();
    ASSERT_TRUE(std::regex_search(worker_log, match,
                                  std::regex("metrics at http://127.0.0.1:([0-9]+)/metrics")))
        << worker_log;
    worker_metrics_ports.push_back(match[1]);
  }

  const int prometheus_port = FreePort();
  const std::string config = testing::TestTmpPath("prometheus.yml");
  std::ofstream(config) << "global:\n  scrape_interval: 1s\n"
                        << "scrape_configs:\n  - job_name: ps\n    static_configs:\n"
                        << "      - targets: ['127.0.0.1:" << metrics_port << "']\n"
                        << "  - job_name: ps-workers\n    static_configs:\n"
                        << "      - targets: ['127.0.0.1:" << worker_metrics_ports[0]
                        << "', '127.0.0.1:" << worker_metrics_ports[1] << "']\n";
  Process prometheus("/usr/bin/prometheus",
                     {"--config.file=" + config,
                      "--storage.tsdb.path=" + testing::TestTmpPath("tsdb"),
                      absl::StrCat("--web.listen-address=127.0.0.1:", prometheus_port)},
                     testing::TestTmpPath("prometheus.log"));

  // Both workers live, as Prometheus scraped it.
  double live = -1;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < give_up) {
    live = Query(python, prometheus_port, "ps_server_job{what=\"live_workers\"}");
    if (live == 2) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  EXPECT_EQ(live, 2) << prometheus.Log();
  const double pushed =
      Query(python, prometheus_port, "ps_server_rpc_bytes_total{kind=\"server_push\"}");
  const double calls =
      Query(python, prometheus_port, "ps_server_rpcs_total{method=\"Push\",code=\"OK\"}");
  const double version = Query(python, prometheus_port, "ps_server_job{what=\"version\"}");
  // The workers' step phases, reported through their heartbeats: the mean
  // compute time of worker 0's steps, as a histogram's sum and count give.
  double computes = -1;
  while (std::chrono::steady_clock::now() < give_up && computes <= 0) {
    computes = Query(python, prometheus_port,
                     "ps_worker_phase_seconds_count{job=\"ps\",rank=\"0\",phase=\"compute\"}");
    if (computes <= 0) std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  const double compute_seconds = Query(
      python, prometheus_port,
      "ps_worker_phase_seconds_sum{job=\"ps\",rank=\"0\",phase=\"compute\"}");
  const double steps = Query(python, prometheus_port, "ps_worker{rank=\"1\",what=\"steps\"}");
  std::printf("Prometheus read back: live workers %g, bytes pushed %g, OK pushes %g, version %g; "
              "worker 0: %g computes, %.2f ms each; worker 1: %g steps\n",
              live, pushed, calls, version, computes, 1e3 * compute_seconds / computes, steps);
  EXPECT_GT(pushed, 0);
  EXPECT_GT(calls, 0);
  EXPECT_GT(version, 0);
  EXPECT_GT(computes, 0);
  EXPECT_GT(compute_seconds, 0);
  EXPECT_GT(steps, 0);

  // The workers' own endpoints: worker 0's compute histogram (its median
  // from the buckets, and its mean) and steps, worker 1's bytes pushed and
  // samples, each from the worker itself.
  const std::string own = "job=\"ps-workers\",";
  double own_computes = -1;
  while (std::chrono::steady_clock::now() < give_up && own_computes <= 0) {
    own_computes = Query(python, prometheus_port,
                         "ps_worker_phase_seconds_count{" + own + "rank=\"0\",phase=\"compute\"}");
    if (own_computes <= 0) std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  const double own_compute_seconds = Query(
      python, prometheus_port,
      "ps_worker_phase_seconds_sum{" + own + "rank=\"0\",phase=\"compute\"}");
  const double median_compute = Query(
      python, prometheus_port,
      "histogram_quantile(0.5, ps_worker_phase_seconds_bucket{" + own +
          "rank=\"0\",phase=\"compute\"})");
  const double own_steps = Query(python, prometheus_port,
                                 "ps_worker_steps_total{" + own + "rank=\"0\"}");
  double own_pushed = -1;
  while (std::chrono::steady_clock::now() < give_up && own_pushed <= 0) {
    own_pushed = Query(python, prometheus_port,
                       "ps_worker_rpc_bytes_total{" + own + "rank=\"1\",kind=\"push_message\"}");
    if (own_pushed <= 0) std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  const double own_samples =
      Query(python, prometheus_port, "ps_worker_samples_total{" + own + "rank=\"1\"}");
  const double own_version =
      Query(python, prometheus_port, "ps_worker_version{" + own + "rank=\"1\"}");
  std::printf("from the workers: worker 0: %g computes, %.2f ms each, median %.2f ms, %g steps; "
              "worker 1: %g bytes pushed, %g samples, version %g\n",
              own_computes, 1e3 * own_compute_seconds / own_computes, 1e3 * median_compute,
              own_steps, own_pushed, own_samples, own_version);
  EXPECT_GT(own_computes, 0);
  EXPECT_GT(own_compute_seconds, 0);
  EXPECT_GT(median_compute, 0);
  EXPECT_GT(own_steps, 0);
  EXPECT_GT(own_pushed, 0);
  EXPECT_GT(own_samples, 0);
  EXPECT_GT(own_version, 0);

  // Every metric the shipped Grafana dashboard draws is one the server or a
  // worker serves.
  const std::string dashboard =
      testing::ReadFileBytes(testing::RunfilePath("deploy/grafana/ps-dashboard.json"));
  ASSERT_FALSE(dashboard.empty());
  std::string served;
  for (const std::string& endpoint : {metrics_port, worker_metrics_ports[0]}) {
    std::string text;
    ASSERT_EQ(testing::RunCommand(
                  absl::StrCat(python, " -c ",
                               testing::ShellQuote(absl::StrCat(
                                   "import urllib.request; print(urllib.request.urlopen("
                                   "'http://127.0.0.1:",
                                   endpoint, "/metrics', timeout=5).read().decode())"))),
                  &text),
              0)
        << text;
    served += text;
  }
  const std::regex name("ps_[a-z_]+");
  int drawn = 0;
  for (auto it = std::sregex_iterator(dashboard.begin(), dashboard.end(), name);
       it != std::sregex_iterator(); ++it) {
    const std::string metric = it->str();
    if (metric == "ps_job" || metric.rfind("ps_dashboard", 0) == 0) continue;  // the uid
    ++drawn;
    EXPECT_NE(served.find("\n" + metric), std::string::npos)
        << "the dashboard draws " << metric << ", which neither the server nor a worker serves";
  }
  EXPECT_GT(drawn, 5);
  for (auto& w : workers) w->Signal(SIGKILL);
  prometheus.Signal(SIGTERM);
  server.Signal(SIGTERM);
}

}  // namespace
}  // namespace ps
