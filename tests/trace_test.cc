// Timelines end to end: a server and two worker processes run with
// --trace; each file opens as a Chrome trace with the lanes and events the
// observer seam promises, and deploy/trace/merge_traces.py merges them into
// one timeline with every process in it, lined up on the host's clock.

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/subprocess.h"
#include "common/timed_event.h"
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

constexpr int kSteps = 5;
constexpr int64_t kServerPid = 1000000;  // server/server_main.cc

// The complete events of one lane and category.
std::vector<Json> Events(const Json& doc, int64_t tid, const std::string& cat) {
  std::vector<Json> out;
  for (const Json& e : doc["traceEvents"]) {
    if (e["ph"] == "X" && e["tid"] == tid && e["cat"] == cat) out.push_back(e);
  }
  return out;
}

// The steps >= 0 of `events`, in file order.
std::vector<int64_t> Steps(const std::vector<Json>& events) {
  std::vector<int64_t> steps;
  for (const Json& e : events) {
    const int64_t step = e["args"]["step"];
    if (step >= 0) steps.push_back(step);
  }
  return steps;
}

// metadata name ("process_name", "thread_name") -> tid -> its args.name
std::map<std::string, std::map<int64_t, std::string>> Metadata(const Json& doc, int64_t pid) {
  std::map<std::string, std::map<int64_t, std::string>> out;
  for (const Json& e : doc["traceEvents"]) {
    if (e["ph"] == "M" && e["pid"] == pid && e["args"].contains("name")) {
      out[e["name"]][e["tid"]] = e["args"]["name"];
    }
  }
  return out;
}

std::string MergeCommand(const std::string& python, const std::string& output,
                         const std::vector<std::string>& inputs) {
  std::string command =
      absl::StrCat(python, " ", testing::ShellQuote(testing::RunfilePath(
                                    "deploy/trace/merge_traces.py")),
                   " -o ", testing::ShellQuote(output));
  for (const std::string& in : inputs) absl::StrAppend(&command, " ", testing::ShellQuote(in));
  return command;
}

std::vector<int64_t> Range(int n) {
  std::vector<int64_t> v;
  for (int i = 0; i < n; ++i) v.push_back(i);
  return v;
}

TEST(TraceTest, ServerAndTwoWorkersWriteTimelinesThatMerge) {
  const std::string port_file = testing::TestTmpPath("port");
  const std::string server_trace = testing::TestTmpPath("server.json");
  Process server(testing::RunfilePath("server/server"),
                 {"--port=0", "--port_file=" + port_file, "--num_workers=2", "--lr=0.1",
                  "--trace=" + server_trace},
                 testing::TestTmpPath("server.log"));
  const int port = tests::WaitForPortFile(port_file);
  ASSERT_GT(port, 0) << server.Log();

  std::vector<std::string> worker_traces;
  std::vector<std::unique_ptr<Process>> workers;
  for (int r = 0; r < 2; ++r) {
    worker_traces.push_back(testing::TestTmpPath(absl::StrCat("worker", r, ".json")));
    workers.push_back(std::make_unique<Process>(
        testing::RunfilePath("worker/worker"),
        std::vector<std::string>{absl::StrCat("--server=127.0.0.1:", port),
                                 absl::StrCat("--worker_id=w", r), absl::StrCat("--rank=", r),
                                 "--dataset=synthetic", "--model=mlp", "--mlp_hidden=32",
                                 "--batch_size=64", "--epochs=1",
                                 absl::StrCat("--max_steps=", kSteps), "--devices=cpu:2",
                                 "--nooverlap", "--threads=1", "--evaluate=false", "--progress=false",
                                 "--trace=" + worker_traces[r]},
        testing::TestTmpPath(absl::StrCat("worker", r, ".log"))));
  }
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(workers[r]->Wait(std::chrono::seconds(240)), 0) << workers[r]->Log();
    EXPECT_THAT(workers[r]->Log(), HasSubstr("wrote the timeline"));
  }
  server.Signal(SIGTERM);
  ASSERT_EQ(server.Wait(std::chrono::seconds(30)), 0) << server.Log();
  EXPECT_THAT(server.Log(), HasSubstr("wrote the timeline"));

  // 1. Each worker: its rank as the process, the lanes named.
  // Two CPU devices without overlap (--nooverlap: every phase of the step
  // on the trainer lane), and no copy to host (pushes read device 0's
  // memory).
  const std::vector<std::string> phases = {"data", "compute", "reduce",
                                           "push", "pull",    "copy_to_device"};
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(worker_traces[r]);
    const Json doc = ReadJsonFile(worker_traces[r]);
    ASSERT_TRUE(doc.contains("traceEvents"));
    EXPECT_EQ(doc["displayTimeUnit"], "ms");
    EXPECT_EQ(doc["otherData"]["dropped_events"], 0);
    for (const Json& e : doc["traceEvents"]) ASSERT_EQ(e["pid"], r) << e;
    auto metadata = Metadata(doc, r);
    EXPECT_EQ(metadata["process_name"][0], absl::StrCat("worker ", r));
    EXPECT_EQ(metadata["thread_name"][kTrainerLane], "trainer");
    EXPECT_EQ(metadata["thread_name"][DeviceLane(0)], "device 0");
    EXPECT_EQ(metadata["thread_name"][DeviceLane(1)], "device 1");
    EXPECT_EQ(metadata["thread_name"][RpcLane(0)], "rpc 0");

    // The six phases on the trainer lane, once per step each, back to back.
    std::vector<Json> trainer;
    for (const Json& e : doc["traceEvents"]) {
      if (e["ph"] == "X" && e["tid"] == kTrainerLane) trainer.push_back(e);
    }
    ASSERT_EQ(trainer.size(), phases.size() * kSteps);
    for (size_t i = 0; i < trainer.size(); ++i) {
      EXPECT_EQ(trainer[i]["cat"], phases[i % phases.size()]) << i;
      EXPECT_EQ(trainer[i]["args"]["step"], static_cast<int64_t>(i / phases.size())) << i;
    }

    // Each device: its compute, and each layer's forward and backward, named.
    for (int d = 0; d < 2; ++d) {
      EXPECT_EQ(Steps(Events(doc, DeviceLane(d), "compute")), Range(kSteps)) << d;
      for (const char* kind : {"forward", "backward"}) {
        std::multiset<std::string> layers;
        for (const Json& e : Events(doc, DeviceLane(d), kind)) layers.insert(e["name"]);
        EXPECT_EQ(layers.count("fc1"), static_cast<size_t>(kSteps)) << kind << " on device " << d;
        EXPECT_EQ(layers.count("fc2"), static_cast<size_t>(kSteps)) << kind << " on device " << d;
      }
    }

    // One push and one pull message per step (the model fits one message),
    // named after its first tensor, a whole model's bytes.
    for (const char* kind : {"push_message", "pull_message"}) {
      const std::vector<Json> messages = Events(doc, RpcLane(0), kind);
      EXPECT_EQ(Steps(messages), Range(kSteps)) << kind;
      for (const Json& m : messages) {
        EXPECT_EQ(m["name"], "fc1.weight") << m;
        EXPECT_EQ(m["args"]["bytes"], 101800) << m;
      }
    }
  }

  // 2. The server: one push event per message per worker, one update and
  //    two pulls (one per worker) per iteration.
  const Json server_doc = ReadJsonFile(server_trace);
  for (const Json& e : server_doc["traceEvents"]) ASSERT_EQ(e["pid"], kServerPid) << e;
  auto metadata = Metadata(server_doc, kServerPid);
  EXPECT_EQ(metadata["process_name"][0], "server");
  EXPECT_EQ(metadata["thread_name"][kServerUpdateLane], "update");
  EXPECT_EQ(metadata["thread_name"][ServerPushLane(1)], "pushes of rank 1");
  for (int r = 0; r < 2; ++r) {
    const std::vector<Json> pushes = Events(server_doc, ServerPushLane(r), "server_push");
    EXPECT_EQ(Steps(pushes), Range(kSteps)) << "rank " << r;
    for (const Json& p : pushes) EXPECT_EQ(p["name"], "fc1.weight");
  }
  // One update per chunk: the model's four tensors fit one chunk each.
  std::vector<int64_t> four_per_step;
  for (int64_t step : Range(kSteps)) four_per_step.insert(four_per_step.end(), 4, step);
  EXPECT_EQ(Steps(Events(server_doc, kServerUpdateLane, "server_update")), four_per_step);
  // Pulls of version v (step v) for v = 0 (the initial parameters) .. kSteps.
  EXPECT_EQ(Steps(Events(server_doc, kServerPullLane, "server_pull")).size(),
            static_cast<size_t>(2 * (kSteps + 1)));

  // 3. Merged: every process with its metadata, and one clock: each
  //    iteration's update comes after every push message of that step began.
  const std::string python = testing::FindPython("json");
  if (python.empty()) GTEST_SKIP() << "no python3 to run merge_traces.py";
  const std::string merged_path = testing::TestTmpPath("merged.json");
  std::string output;
  ASSERT_EQ(testing::RunCommand(MergeCommand(python, merged_path,
                                             {server_trace, worker_traces[0], worker_traces[1]}),
                                &output),
            0)
      << output;
  EXPECT_THAT(output, HasSubstr("3 processes"));
  const Json merged = ReadJsonFile(merged_path);
  size_t inputs_size = server_doc["traceEvents"].size();
  for (const std::string& path : worker_traces) inputs_size += ReadJsonFile(path)["traceEvents"].size();
  EXPECT_EQ(merged["traceEvents"].size(), inputs_size);
  EXPECT_EQ(Metadata(merged, kServerPid)["process_name"][0], "server");
  EXPECT_EQ(Metadata(merged, 0)["process_name"][0], "worker 0");
  EXPECT_EQ(Metadata(merged, 1)["process_name"][0], "worker 1");
  std::map<int64_t, double> update_ts;  // step -> ts
  for (const Json& e : Events(merged, kServerUpdateLane, "server_update")) {
    update_ts[e["args"]["step"]] = e["ts"];
  }
  ASSERT_EQ(update_ts.size(), static_cast<size_t>(kSteps));
  double last_ts = -1e300;
  int pushes_checked = 0;
  for (const Json& e : merged["traceEvents"]) {
    if (e["ph"] != "X") continue;
    EXPECT_GE(e["ts"].get<double>(), last_ts) << "merged events out of order at " << e;
    last_ts = e["ts"];
    if (e["cat"] == "push_message" && e["args"]["step"] >= 0) {
      EXPECT_LE(e["ts"].get<double>(), update_ts[e["args"]["step"]]) << e;
      ++pushes_checked;
    }
  }
  EXPECT_EQ(pushes_checked, 2 * kSteps);
}

TEST(MergeTracesTest, RenumbersACollidingPidAndKeepsItsMetadata) {
  const std::string python = testing::FindPython("json");
  if (python.empty()) GTEST_SKIP() << "no python3 to run merge_traces.py";
  // Two files of pid 0, a microsecond apart on the shared clock.
  std::vector<std::string> inputs;
  for (int i = 0; i < 2; ++i) {
    inputs.push_back(testing::TestTmpPath(absl::StrCat("in", i, ".json")));
    const Json doc = {
        {"traceEvents",
         {{{"name", "process_name"}, {"ph", "M"}, {"pid", 0}, {"tid", 0},
           {"args", {{"name", absl::StrCat("file ", i)}}}},
          {{"name", "data"}, {"cat", "data"}, {"ph", "X"}, {"ts", 5.0}, {"dur", 1.0},
           {"pid", 0}, {"tid", 0}, {"args", {{"step", i}}}}}},
        {"otherData", {{"clock_origin_ns", 1000 * (1 - i)}, {"dropped_events", i}}}};
    std::FILE* f = std::fopen(inputs[i].c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(doc.dump().c_str(), f);
    std::fclose(f);
  }
  const std::string merged_path = testing::TestTmpPath("merged_small.json");
  std::string output;
  ASSERT_EQ(testing::RunCommand(MergeCommand(python, merged_path, inputs), &output), 0) << output;
  EXPECT_THAT(output, HasSubstr("pid 0 is taken, renumbered 1"));
  const Json merged = ReadJsonFile(merged_path);
  EXPECT_EQ(Metadata(merged, 0)["process_name"][0], "file 0");
  EXPECT_EQ(Metadata(merged, 1)["process_name"][0], "file 1");
  EXPECT_EQ(merged["otherData"]["clock_origin_ns"], 0);
  EXPECT_EQ(merged["otherData"]["dropped_events"], 1);
  // File 1's origin is the earlier: its event first, file 0's shifted by 1 us.
  const Json& events = merged["traceEvents"];
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[2]["pid"], 1);
  EXPECT_DOUBLE_EQ(events[2]["ts"].get<double>(), 5.0);
  EXPECT_EQ(events[3]["pid"], 0);
  EXPECT_DOUBLE_EQ(events[3]["ts"].get<double>(), 6.0);
}

TEST(MergeTracesTest, ABadFileIsNamedAndNothingIsWritten) {
  const std::string python = testing::FindPython("json");
  if (python.empty()) GTEST_SKIP() << "no python3 to run merge_traces.py";
  const std::string bad = testing::TestTmpPath("bad.json");
  std::FILE* f = std::fopen(bad.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("{\"traceEvents\": [", f);
  std::fclose(f);
  const std::string merged_path = testing::TestTmpPath("never.json");
  std::string output;
  EXPECT_EQ(testing::RunCommand(MergeCommand(python, merged_path, {bad}), &output), 2);
  EXPECT_THAT(output, HasSubstr(bad + ": not JSON"));
  EXPECT_TRUE(testing::ReadFileBytes(merged_path).empty());

  EXPECT_EQ(testing::RunCommand(MergeCommand(python, merged_path, {bad + ".missing"}), &output),
            2);
  EXPECT_THAT(output, HasSubstr(bad + ".missing: cannot read"));

  // No arguments: the usage line.
  EXPECT_EQ(testing::RunCommand(absl::StrCat(python, " ",
                                             testing::ShellQuote(testing::RunfilePath(
                                                 "deploy/trace/merge_traces.py"))),
                                &output),
            2);
  EXPECT_THAT(output, HasSubstr("usage: merge_traces.py"));
}

}  // namespace
}  // namespace ps
