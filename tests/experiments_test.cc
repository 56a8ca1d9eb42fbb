// The network-experiment harness end to end (deploy/experiments/run.sh): a
// server and two workers, each in its own network namespace behind a
// shaped link, train a small model and the run's results.json says what
// was measured; a run stopped with SIGTERM mid-training leaves nothing of
// itself on the machine (namespaces, links, qdiscs, iptables rules,
// processes). Skips when this machine cannot create network namespaces
// (not root, no `ip`, or `ip netns add` refused), or when a tool of
// deploy/experiments/setup.sh is missing.
//
// A short sweep (deploy/experiments/sweep.py: two configurations, one and
// two server shards) writes its CSV and JSON rows, the analytic model's
// predictions and valid PNG plots; it skips when Debian's matplotlib is
// missing.
//
// The *Ddp* cases (only in //tests:experiments_ddp_test) run the ring
// all-reduce baseline, run.sh --system=ddp: PyTorch DDP over gloo on two
// worker hosts behind 100 Mbit/s, whose row says system=ddp and whose links
// carried the ring's bytes; they skip without Debian's python3-torch.
//
// The *Benchmark* cases measure the emulated link against its settings
// (iperf3, ping); they run only in //tests:experiments_benchmark.

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/testing/subprocess.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/json_file.h"
#include "tests/process.h"

namespace ps {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;
using tests::Process;
using tests::ReadJsonFile;

constexpr int kSteps = 40;
constexpr int64_t kMlpBytes = 25450 * 4;  // --model=mlp --mlp_hidden=32

// Runs `command` with the system tool folders on PATH (Bazel's strict test
// environment has only /bin:/usr/bin). Returns the exit code.
int Sh(const std::string& command, std::string* output) {
  return testing::RunCommand("PATH=\"$PATH:/usr/sbin:/sbin\"; " + command, output);
}

std::string Sh(const std::string& command) {
  std::string output;
  Sh(command, &output);
  return output;
}

// Why this machine cannot run the harness, or "" when it can.
std::string WhyNot() {
  if (geteuid() != 0) return "not root: network namespaces need root";
  std::string output;
  if (Sh("command -v ip", &output) != 0) return "no `ip` (iproute2)";
  const std::string probe = absl::StrCat("psxprobe", getpid());
  if (Sh("ip netns add " + probe, &output) != 0) {
    return absl::StrCat("`ip netns add` failed: ", output);
  }
  Sh("ip netns del " + probe, &output);
  for (const char* tool : {"tc", "iptables-legacy", "gcc", "python3", "iperf3", "ping"}) {
    if (Sh(absl::StrCat("command -v ", tool), &output) != 0) {
      return absl::StrCat("no ", tool, ": run deploy/experiments/setup.sh");
    }
  }
  if (Sh("test -e /usr/include/libnetfilter_queue/libnetfilter_queue.h", &output) != 0) {
    return "no libnetfilter-queue-dev: run deploy/experiments/setup.sh";
  }
  return "";
}

// The pids of processes whose command line mentions `text`.
std::vector<std::string> ProcessesMentioning(const std::string& text) {
  std::vector<std::string> found;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string pid = entry.path().filename();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    if (pid == std::to_string(getpid())) continue;
    std::string cmdline = testing::ReadFileBytes(entry.path() / "cmdline");
    for (char& c : cmdline) {
      if (c == '\0') c = ' ';
    }
    if (cmdline.find(text) != std::string::npos) found.push_back(pid + ": " + cmdline);
  }
  return found;
}

// Each test runs the harness under its own prefix and out dir, and removes
// whatever the run may have left should the test fail half-way.
class ExperimentsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = WhyNot();
    if (!why.empty()) GTEST_SKIP() << "cannot run the network experiments here: " << why;
    const std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    prefix_ = absl::StrCat("psxt", getpid() % 100000, name.size() % 10,
                           static_cast<int>(name[0]) % 10);
    out_ = testing::TestTmpPath(absl::StrCat("out-", name));
    std::filesystem::remove_all(out_);
    ran_ = true;
  }

  void TearDown() override {
    if (!ran_) return;
    std::string output;
    Sh(absl::StrCat("bash ", testing::ShellQuote(Harness("netns.sh")), " cleanup ", prefix_),
       &output);
  }

  static std::string Harness(const std::string& file) {
    return testing::RunfilePath("deploy/experiments/" + file);
  }

  // run.sh with the prebuilt daemons of this test's runfiles.
  std::vector<std::string> RunArgs(std::vector<std::string> flags) const {
    std::string bin = testing::RunfilePath("server/server");
    bin = bin.substr(0, bin.size() - std::string("/server/server").size());
    std::vector<std::string> args = {Harness("run.sh"), "--prefix=" + prefix_, "--out=" + out_,
                                     "--bin=" + bin, "--time_limit=240"};
    args.insert(args.end(), flags.begin(), flags.end());
    return args;
  }

  // What the machine's own namespace holds that a run could have added to
  // (the chains' packet counters stripped: other traffic moves them).
  static std::string RootState() {
    return Sh("ip -o link show; tc qdisc show; "
              "iptables-legacy-save 2>/dev/null | grep -v '^#' | sed 's/ \\[[0-9]*:[0-9]*\\]$//'");
  }

  std::string prefix_;
  std::string out_;
  bool ran_ = false;
};

TEST_F(ExperimentsTest, TwoWorkersBehindShapedLinksWriteResults) {
  const std::string root_before = RootState();
  Process run("/bin/bash",
              RunArgs({"--workers=2", "--rate=1gbit", "--model=mlp", "--dataset=synthetic",
                       "--batch_size=64", absl::StrCat("--max_steps=", kSteps), "--lr=0.1", "--",
                       "--mlp_hidden=32"}),
              testing::TestTmpPath("run.log"));
  ASSERT_EQ(run.Wait(std::chrono::seconds(120)), 0) << run.Log();
  EXPECT_THAT(run.Log(), HasSubstr("results in " + out_ + "/results.json"));

  const Json r = ReadJsonFile(out_ + "/results.json");
  EXPECT_EQ(r["run"], prefix_);
  EXPECT_EQ(r["system"], "ps");
  EXPECT_EQ(r["workers"], 2);
  EXPECT_EQ(r["rate"], "1gbit");
  EXPECT_EQ(r["rate_bits_per_second"], 1000000000);
  EXPECT_EQ(r["delay_ms"], 0);
  EXPECT_EQ(r["delay_method"], "none");
  EXPECT_EQ(r["congestion"], "cubic");
  EXPECT_EQ(r["model"], "mlp");
  EXPECT_EQ(r["steps"], kSteps);
  EXPECT_EQ(r["model_parameters"], kMlpBytes / 4);
  EXPECT_GT(r["samples_per_second"].get<double>(), 0);
  ASSERT_EQ(r["worker_samples_per_second"].size(), 2u);
  double fractions = 0;
  for (const char* phase : {"data", "compute", "reduce", "copy", "push", "wait", "pull"}) {
    const std::string key = absl::StrCat(phase, "_s");
    ASSERT_TRUE(r["time_split_s"].contains(key)) << key;
    EXPECT_GE(r["time_split_s"][key].get<double>(), 0) << key;
    fractions += r["time_split_fraction"][key].get<double>();
  }
  EXPECT_NEAR(fractions, 1.0, 1e-9);
  // The window: worker 0's steps after the first (warm-up), from the first
  // one's start to the last one's (kSteps - 2 periods), between the counter
  // samples around them; the run's whole span is longer.
  EXPECT_EQ(r["servers"], 1);
  EXPECT_EQ(r["warmup_steps"], 1);
  EXPECT_EQ(r["window_steps"], kSteps - 2);
  EXPECT_EQ(r["model_bytes"], kMlpBytes);
  const double window = r["window_s"];
  EXPECT_GT(window, 0);
  EXPECT_GT(r["step_time_s"].get<double>(), 0);
  EXPECT_LE(r["step_time_s"].get<double>() * (kSteps - 2), window);
  EXPECT_LT(window, r["run_window_s"].get<double>());

  // Hosts: the server first, then the workers, each link measured. Every
  // step each worker pushes the model to the server and pulls it back. The
  // window is worker 0's kSteps - 2 step periods; the other worker meets it
  // only at each version, and overlapping, a step's pulls run into the next
  // period, so the window holds at least kSteps - 3 steps' traffic whole:
  // the server receives at least 2 x (kSteps - 3) x model bytes in it and
  // sends as much (a worker, one model's worth each way per step).
  ASSERT_EQ(r["hosts"].size(), 3u);
  const std::vector<std::string> names = {"s0", "w0", "w1"};
  for (int i = 0; i < 3; ++i) {
    const Json& h = r["hosts"][i];
    SCOPED_TRACE(h.dump());
    EXPECT_EQ(h["host"], names[i]);
    EXPECT_EQ(h["address"], absl::StrCat("10.213.0.", i + 2));
    for (const char* dir : {"tx", "rx"}) {
      const int64_t bytes = h[absl::StrCat(dir, "_bytes")];
      EXPECT_GE(bytes, (i == 0 ? 2 : 1) * (kSteps - 3) * kMlpBytes) << dir;
      const double utilisation = h[absl::StrCat(dir, "_utilisation")];
      EXPECT_NEAR(utilisation, bytes * 8 / (window * 1e9), 1e-9) << dir;
      // tbf lets a bucket's worth (at most 4 ms at the rate) above it.
      EXPECT_LE(utilisation, 1.0 + 0.004 / window) << dir;
      // While busy (intervals above half the rate) the link runs at least
      // at half its rate, and over the whole window at most that.
      const double busy = h[absl::StrCat(dir, "_busy_utilisation")];
      const double busy_fraction = h[absl::StrCat(dir, "_busy_fraction")];
      EXPECT_GE(busy_fraction, 0) << dir;
      EXPECT_LE(busy_fraction, 1) << dir;
      if (busy_fraction > 0) {
        EXPECT_GT(busy, 0.5) << dir;
        EXPECT_LT(busy, 1.5) << dir;
      }
    }
  }
  // Each host's TCP loss recovery over the run, read from its namespace.
  for (const Json& h : r["hosts"]) {
    ASSERT_TRUE(h["tcp_retransmitted_segments"].is_number_integer()) << h.dump();
    EXPECT_GE(h["tcp_retransmitted_segments"].get<int64_t>(), 0);
    ASSERT_TRUE(h["tcp_timeouts"].is_number_integer()) << h.dump();
    EXPECT_GE(h["tcp_timeouts"].get<int64_t>(), 0);
  }
  EXPECT_THAT(run.Log(), HasSubstr("TCP segments sent again (timeouts) over the run: s0 "));
  EXPECT_GE(r["cpu_busy"].get<double>(), 0);
  EXPECT_LE(r["cpu_busy"].get<double>(), 1);
  EXPECT_EQ(r["cpu_bound"].get<bool>(), r["cpu_busy"].get<double>() > 0.9);

  // The busiest link, and the step times the links allow: the server's
  // link carries both workers' models each way, 2 x kMlpBytes a step at
  // 1 Gbit/s, in frames 1514 / 1448 of that.
  double busiest = 0;
  std::string busiest_link;
  for (const Json& h : r["hosts"]) {
    for (const char* dir : {"tx", "rx"}) {
      const double u = h[absl::StrCat(dir, "_utilisation")];
      if (u > busiest) {
        busiest = u;
        busiest_link = absl::StrCat(h["host"].get<std::string>(), " ", dir);
      }
    }
  }
  EXPECT_EQ(r["max_link_utilisation"].get<double>(), busiest);
  EXPECT_EQ(r["busiest_link"], busiest_link);
  const double payload_bound = 2.0 * kMlpBytes * 8 / 1e9;
  EXPECT_NEAR(r["payload_bound_s"].get<double>(), payload_bound, 1e-12);
  EXPECT_NEAR(r["link_bound_s"].get<double>(), payload_bound * 1514 / 1448, 1e-12);
  const double step = r["step_time_s"];
  EXPECT_NEAR(r["step_over_link_bound"].get<double>(), step / (payload_bound * 1514 / 1448),
              1e-9);
  EXPECT_NEAR(r["step_over_payload_bound"].get<double>(), step / payload_bound, 1e-9);
  // (A step can come in under the bound here: tbf's bucket, 128 KiB at
  // least, passes this model's 100 KB messages at the veth's own speed.)
  EXPECT_GT(r["step_over_link_bound"].get<double>(), 0.0);
  EXPECT_THAT(run.Log(), HasSubstr("x what the busiest link needs a step in frames"));

  // The merged timeline holds the server and both workers.
  const Json trace = ReadJsonFile(r["trace"]);
  std::set<int64_t> pids;
  for (const Json& e : trace["traceEvents"]) pids.insert(e["pid"].get<int64_t>());
  EXPECT_EQ(pids, (std::set<int64_t>{0, 1, 1000000}));

  // results.csv: a header and one row with the same figures.
  const std::vector<std::string> lines =
      absl::StrSplit(testing::ReadFileBytes(out_ + "/results.csv"), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 2u);
  const std::vector<std::string> header = absl::StrSplit(lines[0], ',');
  const std::vector<std::string> row = absl::StrSplit(lines[1], ',');
  ASSERT_EQ(header.size(), row.size());
  std::map<std::string, std::string> columns;
  for (size_t i = 0; i < header.size(); ++i) columns[header[i]] = row[i];
  EXPECT_EQ(columns["run"], prefix_);
  EXPECT_EQ(columns["system"], "ps");
  EXPECT_EQ(columns["steps"], std::to_string(kSteps));
  EXPECT_EQ(columns["s0_rx_bytes"], r["hosts"][0]["rx_bytes"].dump());
  EXPECT_TRUE(columns.count("samples_per_second"));
  EXPECT_TRUE(columns.count("split_push"));

  EXPECT_EQ(Sh("ip netns list | grep " + prefix_), "");
  EXPECT_EQ(RootState(), root_before);
}

// The ring all-reduce baseline: two DDP ranks, one per worker host behind
// 100 Mbit/s, no server host. An MLP of 784-256-10 (814 KB of gradients,
// one DDP bucket) makes each step's ring about 65 ms at the rate, so the
// counters' 10 ms samples bracket the window closely.
TEST_F(ExperimentsTest, DdpRingBaselineWritesItsRowAndCarriesTheRingsBytes) {
  std::string output;
  if (Sh("/usr/bin/python3 -c 'import torch.distributed'", &output) != 0) {
    GTEST_SKIP() << "no PyTorch in Debian's /usr/bin/python3 (python3-torch): " << output;
  }
  constexpr int kDdpSteps = 15;
  constexpr int kWorkers = 2;
  constexpr int64_t kMlp256Bytes = 203530 * 4;  // --mlp_hidden=256
  // A shared CSV already holding a row of ours, with a server host's
  // column the ring's row lacks (and none of its workers').
  const std::string csv = out_ + "-sweep.csv";
  std::ofstream(csv) << "run,system,servers,s0_tx_bytes\nearlier,ps,1,5\n";
  const std::string root_before = RootState();
  Process run("/bin/bash",
              RunArgs({"--system=ddp", absl::StrCat("--workers=", kWorkers), "--rate=100mbit",
                       "--model=mlp", "--dataset=synthetic", "--batch_size=32",
                       absl::StrCat("--max_steps=", kDdpSteps), "--lr=0.1", "--csv=" + csv, "--",
                       "--mlp_hidden=256"}),
              testing::TestTmpPath("run_ddp.log"));
  ASSERT_EQ(run.Wait(std::chrono::seconds(180)), 0) << run.Log();
  EXPECT_THAT(run.Log(), HasSubstr("ring all-reduce (PyTorch DDP, gloo), 2 workers"));

  const Json r = ReadJsonFile(out_ + "/results.json");
  EXPECT_EQ(r["system"], "ddp");
  EXPECT_EQ(r["workers"], kWorkers);
  EXPECT_EQ(r["servers"], 0);
  EXPECT_EQ(r["steps"], kDdpSteps);
  EXPECT_EQ(r["model_bytes"], kMlp256Bytes);
  EXPECT_EQ(r["window_steps"], kDdpSteps - 2);
  EXPECT_GT(r["step_time_s"].get<double>(), 0);
  EXPECT_GT(r["step_time_median_s"].get<double>(), 0);
  EXPECT_GT(r["samples_per_second"].get<double>(), 0);

  // The ring's bytes: each worker sends and receives 2 (W - 1) / W of the
  // model per step (the model itself for two). The window brackets whole
  // steps (a step's all-reduce ends inside its backward), so each link
  // carried at least window_steps rings' worth. However late a loaded
  // sampler's samples, no window holds more than the whole run's: a ring
  // per step and DDP's broadcast of rank 0's weights at its start, with 10 %
  // for headers and the rendezvous.
  const double ring_bytes = 2.0 * (kWorkers - 1) / kWorkers * kMlp256Bytes;
  const int window_steps = r["window_steps"];
  ASSERT_EQ(r["hosts"].size(), 2u);
  for (int i = 0; i < kWorkers; ++i) {
    const Json& h = r["hosts"][i];
    SCOPED_TRACE(h.dump());
    EXPECT_EQ(h["host"], absl::StrCat("w", i));
    EXPECT_EQ(h["address"], absl::StrCat("10.213.0.", i + 2));
    for (const char* dir : {"tx", "rx"}) {
      const double bytes = h[absl::StrCat(dir, "_bytes")].get<double>();
      EXPECT_GE(bytes, 0.9 * window_steps * ring_bytes) << dir;
      EXPECT_LE(bytes, 1.1 * (kDdpSteps * ring_bytes + kMlp256Bytes)) << dir;
    }
  }
  // The bound is the ring's bytes through one worker's link at the rate.
  const double payload_bound = ring_bytes * 8 / 1e8;
  EXPECT_NEAR(r["payload_bound_s"].get<double>(), payload_bound, 1e-12);
  EXPECT_NEAR(r["link_bound_s"].get<double>(), payload_bound * 1514 / 1448, 1e-12);
  EXPECT_NEAR(r["step_over_payload_bound"].get<double>(),
              r["step_time_s"].get<double>() / payload_bound, 1e-9);
  EXPECT_THAT(run.Log(), HasSubstr("run: ddp: step "));

  // The row, in the run's results.csv and appended to --csv, says which
  // system made it. The shared CSV now has the columns of both rows, each
  // value under its own name (the earlier row's s0_tx_bytes kept, the
  // ring's empty there, its w1_tx_bytes the results' figure).
  for (const std::string& path : {out_ + "/results.csv", csv}) {
    SCOPED_TRACE(path);
    const std::vector<std::string> lines =
        absl::StrSplit(testing::ReadFileBytes(path), '\n', absl::SkipEmpty());
    const bool shared = path == csv;
    ASSERT_EQ(lines.size(), shared ? 3u : 2u);
    const std::vector<std::string> header = absl::StrSplit(lines[0], ',');
    std::vector<std::map<std::string, std::string>> rows;
    for (size_t l = 1; l < lines.size(); ++l) {
      const std::vector<std::string> row = absl::StrSplit(lines[l], ',');
      ASSERT_EQ(header.size(), row.size()) << lines[l];
      rows.emplace_back();
      for (size_t i = 0; i < header.size(); ++i) rows.back()[header[i]] = row[i];
    }
    std::map<std::string, std::string>& columns = rows.back();
    EXPECT_EQ(columns["system"], "ddp");
    EXPECT_EQ(columns["servers"], "0");
    EXPECT_GT(std::stod(columns["step_time_s"]), 0);
    EXPECT_EQ(columns["w1_tx_bytes"], r["hosts"][1]["tx_bytes"].dump());
    if (shared) {
      EXPECT_EQ(header[3], "s0_tx_bytes");
      EXPECT_EQ(columns["s0_tx_bytes"], "");
      EXPECT_EQ(rows[0]["run"], "earlier");
      EXPECT_EQ(rows[0]["system"], "ps");
      EXPECT_EQ(rows[0]["s0_tx_bytes"], "5");
      EXPECT_EQ(rows[0]["w1_tx_bytes"], "");
    }
  }

  EXPECT_EQ(Sh("ip netns list | grep " + prefix_), "");
  EXPECT_EQ(RootState(), root_before);
}

// What the baseline cannot honour is refused before any host is built.
TEST_F(ExperimentsTest, DdpRefusesServerAndReplayFlags) {
  for (const char* flag : {"--servers=2", "--compute=replay", "--server_flags=--x=1"}) {
    SCOPED_TRACE(flag);
    Process run("/bin/bash",
                RunArgs({"--system=ddp", "--workers=2", "--max_steps=5", flag}),
                testing::TestTmpPath("run_ddp_refused.log"));
    EXPECT_EQ(run.Wait(std::chrono::seconds(30)), 1) << run.Log();
    EXPECT_THAT(run.Log(), HasSubstr("--system=ddp"));
    EXPECT_EQ(Sh("ip netns list | grep " + prefix_), "");
  }
}

// SIGTERM to run.sh while the workers train, with a delayed link so the
// NFQUEUE rules and delay processes exist too: everything goes.
TEST_F(ExperimentsTest, SigtermMidRunLeavesNothingBehind) {
  const std::string root_before = RootState();
  Process run("/bin/bash",
              RunArgs({"--workers=2", "--rate=100mbit", "--delay=2", "--model=lenet",
                       "--dataset=synthetic", "--batch_size=64", "--max_steps=100000"}),
              testing::TestTmpPath("run_killed.log"));
  ASSERT_TRUE(tests::WaitForLog(run, "workers training", std::chrono::seconds(60))) << run.Log();
  EXPECT_THAT(run.Log(), HasSubstr("(nfqueue)"));
  // Both workers registered and stepping: the server has seen pushes.
  const std::string worker_log = out_ + "/worker-1.log";
  bool training = false;
  for (int i = 0; i < 600 && !training; ++i) {
    training = testing::ReadFileBytes(worker_log).find("training lenet") != std::string::npos;
    if (!training) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(training) << testing::ReadFileBytes(worker_log);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  // What the run has now: its namespaces, each host's delayer and its rule.
  EXPECT_EQ(Sh("ip netns list | grep -c '^" + prefix_ + "-'"), "4\n");
  EXPECT_THAT(Sh("ip netns exec " + prefix_ + "-w0 iptables-legacy -t mangle -S PREROUTING"),
              HasSubstr("NFQUEUE"));
  EXPECT_THAT(Sh("tc -n " + prefix_ + "-w0 qdisc show dev eth0"), HasSubstr("tbf"));
  // Each host's TCP is the run's (cubic), whatever the machine's default.
  EXPECT_EQ(Sh("ip netns exec " + prefix_ + "-s0 sysctl -n net.ipv4.tcp_congestion_control"),
            "cubic\n");
  EXPECT_GE(ProcessesMentioning(out_).size(), 4u);  // server, workers, delayers

  run.Signal(SIGTERM);
  EXPECT_EQ(run.Wait(std::chrono::seconds(60)), 143) << run.Log();
  EXPECT_THAT(run.Log(), HasSubstr("terminated; removing " + prefix_));
  EXPECT_EQ(Sh("ip netns list | grep " + prefix_), "");
  EXPECT_THAT(ProcessesMentioning(out_), ::testing::IsEmpty());
  EXPECT_EQ(RootState(), root_before);
  EXPECT_FALSE(std::filesystem::exists(out_ + "/results.json"));
}

// Compute replay: four workers start one after another, each timing its own
// pass while the others wait, then sleep through it each step; the results
// say which mode produced them and what was replayed.
TEST_F(ExperimentsTest, ReplayedComputeStartsWorkersInTurnAndSaysSo) {
  Process run("/bin/bash",
              RunArgs({"--workers=4", "--rate=1gbit", "--model=lenet", "--dataset=synthetic",
                       "--batch_size=256", "--epochs=100", "--max_steps=8", "--warmup_steps=2",
                       "--lr=0.01", "--compute=replay"}),
              testing::TestTmpPath("run.log"));
  ASSERT_EQ(run.Wait(std::chrono::seconds(120)), 0) << run.Log();
  const Json r = ReadJsonFile(out_ + "/results.json");
  EXPECT_EQ(r["compute"], "replay");
  EXPECT_GT(r["replay_step_s"].get<double>(), 0);
  EXPECT_EQ(r["steps"], 8);
  EXPECT_EQ(r["window_steps"], 5);
  // Each worker replays its own pass; the split's compute is at least it.
  for (int w = 0; w < 4; ++w) {
    EXPECT_THAT(testing::ReadFileBytes(absl::StrCat(out_, "/worker-", w, ".log")),
                HasSubstr("replaying compute"));
  }
  EXPECT_GE(r["time_split_s"]["compute_s"].get<double>(),
            0.99 * 8 * r["replay_step_s"].get<double>());
  EXPECT_EQ(Sh("ip netns list | grep " + prefix_), "");
}

// --model_profile: the workers replay a model profile from outside (the
// committed PyTorch LeNet's) as their model; the row counts its parameters
// and every worker pushed its bytes.
TEST_F(ExperimentsTest, AModelProfileIsEveryWorkersModel) {
  Process run("/bin/bash",
              RunArgs({"--workers=2", "--rate=1gbit", "--batch_size=64", "--max_steps=6",
                       "--warmup_steps=2",
                       "--model_profile=" + Harness("profiles/lenet.json")}),
              testing::TestTmpPath("run.log"));
  ASSERT_EQ(run.Wait(std::chrono::seconds(120)), 0) << run.Log();
  const Json r = ReadJsonFile(out_ + "/results.json");
  EXPECT_EQ(r["model"], "profile:lenet");
  EXPECT_EQ(r["dataset"], "synthetic");
  EXPECT_EQ(r["model_parameters"], 61706);
  EXPECT_EQ(r["steps"], 6);
  for (int w = 0; w < 2; ++w) {
    const std::string log = testing::ReadFileBytes(absl::StrCat(out_, "/worker-", w, ".log"));
    EXPECT_THAT(log, HasSubstr("training the profile of lenet (61706 parameters)"));
    EXPECT_THAT(log, HasSubstr("pushed 246824 and pulled 246824 bytes per step"));
  }
  // A bad profile or a second replay is refused before any host is made.
  std::string output;
  EXPECT_NE(testing::RunCommand(absl::StrCat("bash ", testing::ShellQuote(Harness("run.sh")),
                                             " --model_profile=", Harness("profiles/lenet.json"),
                                             " --compute=replay 2>&1"),
                                &output),
            0);
  EXPECT_THAT(output, HasSubstr("leave out --compute=replay"));
  EXPECT_EQ(Sh("ip netns list | grep " + prefix_), "");
}

// Two configurations (one worker behind 1 Gbit/s links, with one server and
// with two shards) through sweep.py: one CSV row and one JSON run each, the
// model's predictions finite, and three PNG plots.
TEST_F(ExperimentsTest, ShortSweepWritesRowsPredictionsAndPlots) {
  std::string output;
  if (Sh("/usr/bin/python3 -c 'import matplotlib'", &output) != 0) {
    GTEST_SKIP() << "no matplotlib for /usr/bin/python3 (python3-matplotlib, "
                    "deploy/experiments/setup.sh): "
                 << output;
  }
  std::vector<std::string> args = RunArgs({});
  const std::string bin = args[3].substr(std::string("--bin=").size());
  Process sweep("/usr/bin/python3",
                {Harness("sweep.py"), "--out=" + out_, "--runs_dir=" + out_ + "/runs",
                 "--prefix=" + prefix_, "--bin=" + bin, "--workers=1", "--servers=1,2",
                 "--rates=1gbit", "--models=mlp:32", "--min_steps=20", "--max_steps=20",
                 "--batch_size=64"},
                testing::TestTmpPath("sweep.log"));
  ASSERT_EQ(sweep.Wait(std::chrono::seconds(110)), 0) << sweep.Log();

  const std::vector<std::string> lines =
      absl::StrSplit(testing::ReadFileBytes(out_ + "/sweep.csv"), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u) << sweep.Log();
  const std::vector<std::string> header = absl::StrSplit(lines[0], ',');
  for (int i = 1; i <= 2; ++i) {
    const std::vector<std::string> row = absl::StrSplit(lines[i], ',');
    ASSERT_EQ(row.size(), header.size());
    std::map<std::string, std::string> columns;
    for (size_t j = 0; j < header.size(); ++j) columns[header[j]] = row[j];
    EXPECT_EQ(columns["config"], absl::StrCat("mlp-32_w1_s", i, "_1gbit_d0"));
    EXPECT_EQ(columns["compute"], "real");
    EXPECT_EQ(columns["batch_size"], "64");
    EXPECT_EQ(columns["servers"], std::to_string(i));
    EXPECT_EQ(columns["steps"], "20");
    EXPECT_EQ(columns["model_bytes"], std::to_string(kMlpBytes));
    EXPECT_GT(std::stod(columns["step_time_s"]), 0);
    EXPECT_GT(std::stod(columns["server_rx_utilisation"]), 0);
  }

  const Json doc = ReadJsonFile(out_ + "/sweep.json");
  ASSERT_EQ(doc["runs"].size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const Json& run = doc["runs"][i];
    EXPECT_EQ(run["servers"], i + 1);
    EXPECT_EQ(run["results"]["hosts"].size(), static_cast<size_t>(i + 2));  // S servers + w0
    EXPECT_EQ(run["results"]["window_steps"], 18);  // periods of 19 steps after warm-up
  }
  const Json model = ReadJsonFile(out_ + "/model.json");
  ASSERT_EQ(model["rows"].size(), 2u);
  for (const Json& p : model["rows"]) {
    SCOPED_TRACE(p.dump());
    for (const char* key : {"predicted_step_s", "predicted_shared_cpu_step_s",
                            "overlap_bound_step_s", "measured_step_s", "error", "comm_s"}) {
      ASSERT_TRUE(p[key].is_number()) << key;
      EXPECT_TRUE(std::isfinite(p[key].get<double>())) << key;
    }
    EXPECT_GT(p["predicted_step_s"].get<double>(), 0);
    EXPECT_LE(p["overlap_bound_step_s"].get<double>(), p["predicted_step_s"].get<double>());
  }
  for (const char* png : {"speedup.png", "breakdown.png", "utilisation.png"}) {
    const std::string bytes = testing::ReadFileBytes(out_ + "/" + png);
    EXPECT_EQ(bytes.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8)) << png;
    EXPECT_GT(bytes.size(), 1000u) << png;
  }
  EXPECT_EQ(Sh("ip netns list | grep " + prefix_), "");
}

// The emulated link against its settings: one iperf3 stream within 85-101 %
// of the tbf rate, ping RTT within 10 % of twice the delay.
TEST_F(ExperimentsTest, BenchmarkLinkCheckMatchesRateAndDelay) {
  for (const auto& [rate, bps, delay] :
       std::vector<std::tuple<std::string, double, int>>{{"100mbit", 1e8, 5}, {"1gbit", 1e9, 1}}) {
    SCOPED_TRACE(rate);
    std::filesystem::remove_all(out_);
    Process run("/bin/bash",
                RunArgs({"--check", "--workers=1", "--rate=" + rate,
                         absl::StrCat("--delay=", delay)}),
                testing::TestTmpPath("check.log"));
    ASSERT_EQ(run.Wait(std::chrono::seconds(60)), 0) << run.Log();
    const Json c = ReadJsonFile(out_ + "/check.json");
    EXPECT_EQ(c["rate_bits_per_second"].get<double>(), bps);
    EXPECT_GT(c["throughput_ratio"].get<double>(), 0.85) << c.dump();
    EXPECT_LT(c["throughput_ratio"].get<double>(), 1.01) << c.dump();
    // Within 10 % of the configured round trip: the delayers hold each
    // packet that much less than the delay as their own path costs
    // (netns.sh measures it at set-up).
    EXPECT_NEAR(c["ping_rtt_avg_ms"].get<double>(), 2 * delay, 0.10 * 2 * delay) << c.dump();
    EXPECT_EQ(Sh("ip netns list | grep " + prefix_), "");
  }
}

}  // namespace
}  // namespace ps
