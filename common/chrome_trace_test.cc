#include "common/chrome_trace.h"

#include <cstdio>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/subprocess.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ps {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

TimedEvent Event(EventKind kind, int32_t lane, int64_t start_ns, int64_t end_ns,
                 absl::string_view name = {}, int64_t step = 3, int64_t bytes = 0) {
  TimedEvent e;
  e.kind = kind;
  e.lane = lane;
  e.step = step;
  e.name = name;
  e.start_ns = start_ns;
  e.end_ns = end_ns;
  e.bytes = bytes;
  return e;
}

// Writes the trace to a file and parses it back, as a viewer would.
Json WriteAndParse(const ChromeTraceObserver& trace, const std::string& file) {
  const std::string path = testing::TestTmpPath(file);
  const absl::Status status = trace.WriteTo(path);
  EXPECT_TRUE(status.ok()) << status;
  return Json::parse(testing::ReadFileBytes(path));
}

std::vector<Json> Phase(const Json& doc, const std::string& ph) {
  std::vector<Json> out;
  for (const Json& e : doc["traceEvents"]) {
    if (e["ph"] == ph) out.push_back(e);
  }
  return out;
}

TEST(ChromeTraceTest, WritesEveryFieldAndTheMetadata) {
  ChromeTraceOptions options;
  options.pid = 7;
  options.process_name = "worker 7";
  options.origin_ns = 1000;
  ChromeTraceObserver trace(options);
  trace.OnEvent(Event(EventKind::kPush, kTrainerLane, 1000, 3500, {}, 3, 4096));
  trace.OnEvent(Event(EventKind::kForward, DeviceLane(1), 1500, 1750, "conv1"));
  trace.OnEvent(Event(EventKind::kPushMessage, RpcLane(2), 2000, 3001, "fc1.weight", 3, 400));
  EXPECT_EQ(trace.size(), 3);
  EXPECT_EQ(trace.dropped(), 0);

  const Json doc = WriteAndParse(trace, "fields.json");
  EXPECT_EQ(doc["displayTimeUnit"], "ms");
  EXPECT_EQ(doc["otherData"]["clock_origin_ns"], 1000);
  EXPECT_EQ(doc["otherData"]["dropped_events"], 0);

  // Metadata first: the process, then each lane (name and sort index), by lane.
  const Json& all = doc["traceEvents"];
  ASSERT_EQ(all.size(), 1u + 2 * 3 + 3);
  EXPECT_EQ(all[0], Json::parse(R"({"name":"process_name","ph":"M","pid":7,"tid":0,
                                    "args":{"name":"worker 7"}})"));
  const std::vector<std::pair<int, std::string>> lanes = {
      {kTrainerLane, "trainer"}, {DeviceLane(1), "device 1"}, {RpcLane(2), "rpc 2"}};
  for (size_t i = 0; i < lanes.size(); ++i) {
    const Json& name = all[1 + 2 * i];
    const Json& sort = all[2 + 2 * i];
    EXPECT_EQ(name["name"], "thread_name");
    EXPECT_EQ(name["ph"], "M");
    EXPECT_EQ(name["pid"], 7);
    EXPECT_EQ(name["tid"], lanes[i].first);
    EXPECT_EQ(name["args"]["name"], lanes[i].second);
    EXPECT_EQ(sort["name"], "thread_sort_index");
    EXPECT_EQ(sort["tid"], lanes[i].first);
    EXPECT_EQ(sort["args"]["sort_index"], lanes[i].first);
  }

  // Complete events: microseconds from the origin, nanosecond resolution.
  const std::vector<Json> x = Phase(doc, "X");
  ASSERT_EQ(x.size(), 3u);
  EXPECT_EQ(x[0], Json::parse(R"({"name":"push","cat":"push","ph":"X","ts":0.0,"dur":2.5,
                                  "pid":7,"tid":0,"args":{"step":3,"bytes":4096}})"));
  EXPECT_EQ(x[1]["name"], "conv1");
  EXPECT_EQ(x[1]["cat"], "forward");
  EXPECT_EQ(x[1]["tid"], DeviceLane(1));
  EXPECT_DOUBLE_EQ(x[1]["ts"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(x[1]["dur"].get<double>(), 0.25);
  EXPECT_EQ(x[2]["name"], "fc1.weight");
  EXPECT_EQ(x[2]["cat"], "push_message");
  EXPECT_EQ(x[2]["tid"], RpcLane(2));
  EXPECT_DOUBLE_EQ(x[2]["ts"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(x[2]["dur"].get<double>(), 1.001);
  EXPECT_EQ(x[2]["args"]["bytes"], 400);
}

TEST(ChromeTraceTest, OrdersByStartWithTheEnclosingEventFirst) {
  ChromeTraceObserver trace;  // origin: the first event's start
  // Arrival order is end order: the layers before the compute they are in.
  trace.OnEvent(Event(EventKind::kForward, DeviceLane(0), 5000, 6000, "fc1"));
  trace.OnEvent(Event(EventKind::kBackward, DeviceLane(0), 6000, 7000, "fc1"));
  trace.OnEvent(Event(EventKind::kCompute, DeviceLane(0), 5000, 7000));
  trace.OnEvent(Event(EventKind::kData, kTrainerLane, 4000, 5000));
  trace.OnEvent(Event(EventKind::kCompute, kTrainerLane, 5000, 7000));
  const Json doc = WriteAndParse(trace, "order.json");
  const std::vector<Json> x = Phase(doc, "X");
  ASSERT_EQ(x.size(), 5u);
  std::vector<std::string> order;
  for (const Json& e : x) order.push_back(absl::StrCat(e["cat"].get<std::string>(), "@", e["tid"].get<int>()));
  // Equal spans keep their arrival order (device compute before trainer compute).
  EXPECT_EQ(order, (std::vector<std::string>{"data@0", "compute@1", "compute@0", "forward@1",
                                             "backward@1"}));
  EXPECT_DOUBLE_EQ(x[0]["ts"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(x[1]["ts"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(x[4]["ts"].get<double>(), 2.0);
  EXPECT_EQ(doc["otherData"]["clock_origin_ns"], 4000);
}

TEST(ChromeTraceTest, KeepsAtMostMaxEventsAndCountsTheRest) {
  ChromeTraceOptions options;
  options.max_events = 2;
  ChromeTraceObserver trace(options);
  for (int i = 0; i < 5; ++i) trace.OnEvent(Event(EventKind::kWait, kTrainerLane, i, i + 1));
  EXPECT_EQ(trace.size(), 2);
  EXPECT_EQ(trace.dropped(), 3);
  const Json doc = WriteAndParse(trace, "dropped.json");
  EXPECT_EQ(Phase(doc, "X").size(), 2u);
  EXPECT_EQ(doc["otherData"]["dropped_events"], 3);
}

TEST(ChromeTraceTest, AProcessSetLaterNamesEveryEvent) {
  ChromeTraceObserver trace;
  trace.OnEvent(Event(EventKind::kData, kTrainerLane, 0, 1));
  trace.set_process(2, "worker 2");
  trace.OnEvent(Event(EventKind::kCompute, kTrainerLane, 1, 2));
  const Json doc = WriteAndParse(trace, "pid.json");
  for (const Json& e : doc["traceEvents"]) EXPECT_EQ(e["pid"], 2) << e;
  EXPECT_EQ(doc["traceEvents"][0]["args"]["name"], "worker 2");

  ChromeTraceOptions options;
  options.pid = 5;
  ChromeTraceObserver unnamed(options);
  EXPECT_EQ(WriteAndParse(unnamed, "unnamed.json")["traceEvents"][0]["args"]["name"],
            "process 5");
}

TEST(ChromeTraceTest, CopiesTheNameDuringTheCall) {
  ChromeTraceObserver trace;
  {
    std::string name = "a layer with a long name, beyond the small-string buffer";
    trace.OnEvent(Event(EventKind::kForward, DeviceLane(0), 0, 1, name));
    name.assign(name.size(), 'x');
  }
  EXPECT_EQ(Phase(WriteAndParse(trace, "name.json"), "X")[0]["name"],
            "a layer with a long name, beyond the small-string buffer");
}

TEST(ChromeTraceTest, ReplacesAnEarlierFileAndLeavesNoTemporary) {
  const std::string path = testing::TestTmpPath("replaced.json");
  ChromeTraceObserver first, second;
  first.OnEvent(Event(EventKind::kData, kTrainerLane, 0, 1));
  ASSERT_TRUE(first.WriteTo(path).ok());
  ASSERT_TRUE(second.WriteTo(path).ok());
  EXPECT_TRUE(Phase(Json::parse(testing::ReadFileBytes(path)), "X").empty());
  EXPECT_EQ(std::fopen((path + ".tmp").c_str(), "r"), nullptr);
}

TEST(ChromeTraceTest, AnUnwritablePathIsNamedInTheError) {
  ChromeTraceObserver trace;
  const std::string path = testing::TestTmpPath("no/such/dir/trace.json");
  const absl::Status status = trace.WriteTo(path);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(status.message()), HasSubstr(path));
}

TEST(ChromeTraceTest, EventsFromSeveralThreadsAreAllKept) {
  ChromeTraceObserver trace;
  constexpr int kThreads = 4;
  constexpr int kEach = 2000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&trace, t] {
      for (int i = 0; i < kEach; ++i) {
        const std::string name = absl::StrCat("t", t, "/", i);
        trace.OnEvent(Event(EventKind::kForward, DeviceLane(t), i, i + 1, name, i));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(trace.size(), kThreads * kEach);
  const std::vector<Json> x = Phase(WriteAndParse(trace, "threads.json"), "X");
  std::set<std::string> names;
  for (const Json& e : x) {
    const std::string name = e["name"];
    EXPECT_EQ(name, absl::StrCat("t", e["tid"].get<int>() - DeviceLane(0), "/",
                                 e["args"]["step"].get<int>()));
    names.insert(name);
  }
  EXPECT_EQ(names.size(), static_cast<size_t>(kThreads * kEach));
}

}  // namespace
}  // namespace ps
