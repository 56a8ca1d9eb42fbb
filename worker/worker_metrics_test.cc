#include "worker/worker_metrics.h"

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/timed_event.h"
#include "gtest/gtest.h"

namespace ps::worker {
namespace {

// Every series' value as "name,label=value,...": a counter's or gauge's
// value, a histogram's count (and its sum as "name_sum,..." and each bucket
// as "name_bucket,...,le=B").
std::map<std::string, double> Values(const prometheus::Registry& registry) {
  std::map<std::string, double> values;
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    for (const prometheus::ClientMetric& metric : family.metric) {
      std::string labels;
      for (const prometheus::ClientMetric::Label& label : metric.label) {
        absl::StrAppend(&labels, ",", label.name, "=", label.value);
      }
      switch (family.type) {
        case prometheus::MetricType::Counter:
          values[family.name + labels] = metric.counter.value;
          break;
        case prometheus::MetricType::Gauge:
          values[family.name + labels] = metric.gauge.value;
          break;
        case prometheus::MetricType::Histogram:
          values[family.name + labels] = static_cast<double>(metric.histogram.sample_count);
          values[family.name + "_sum" + labels] = metric.histogram.sample_sum;
          for (const prometheus::ClientMetric::Bucket& b : metric.histogram.bucket) {
            values[absl::StrCat(family.name, "_bucket", labels, ",le=", b.upper_bound)] =
                static_cast<double>(b.cumulative_count);
          }
          break;
        default:
          break;
      }
    }
  }
  return values;
}

TimedEvent Phase(EventKind kind, int64_t nanoseconds) {
  TimedEvent event;
  event.kind = kind;
  event.end_ns = nanoseconds;
  return event;
}

TEST(WorkerMetricsTest, NothingIsCountedBeforeTheRankIsKnown) {
  prometheus::Registry registry;
  WorkerMetrics metrics(registry);
  metrics.OnEvent(Phase(EventKind::kCompute, 1000));
  metrics.OnStep(0, 1, 128);
  metrics.SetVersion(3);
  metrics.EndCall(metrics.StartCall(WorkerMetrics::Direction::kPush, 64));
  for (const auto& [series, value] : Values(registry)) {
    ADD_FAILURE() << series << " = " << value << " before Bind";
  }
}

TEST(WorkerMetricsTest, PhasesStepsSamplesAndVersionCarryTheRank) {
  prometheus::Registry registry;
  WorkerMetrics metrics(registry);
  metrics.Bind(3);
  metrics.OnEvent(Phase(EventKind::kCompute, 2000000));
  metrics.OnEvent(Phase(EventKind::kPush, 1000000));
  TimedEvent message = Phase(EventKind::kPushMessage, 500);
  message.lane = RpcLane(0);
  message.bytes = 4000;
  metrics.OnEvent(message);
  metrics.OnStep(0, 1, 128);
  metrics.OnStep(0, 2, 256);
  metrics.OnStep(1, 1, 100);  // a new epoch counts from 0 again
  metrics.SetVersion(41);
  std::map<std::string, double> v = Values(registry);
  EXPECT_EQ(v["ps_worker_phase_seconds,phase=compute,rank=3"], 1);
  EXPECT_DOUBLE_EQ(v["ps_worker_phase_seconds_sum,phase=compute,rank=3"], 0.002);
  EXPECT_EQ(v["ps_worker_phase_seconds,phase=push,rank=3"], 1);
  EXPECT_EQ(v["ps_worker_rpc_bytes_total,kind=push_message,rank=3"], 4000);
  EXPECT_EQ(v["ps_worker_steps_total,rank=3"], 3);
  EXPECT_EQ(v["ps_worker_samples_total,rank=3"], 356);
  EXPECT_EQ(v["ps_worker_version,rank=3"], 41);
}

TEST(WorkerMetricsTest, SamplesCountAfreshAfterARecovery) {
  prometheus::Registry registry;
  WorkerMetrics metrics(registry);
  metrics.Bind(0);
  metrics.OnStep(0, 1, 128);
  metrics.OnRecovery();
  // Asynchronous: the worker goes on at its next step, the epoch's samples
  // counted from 0 again.
  metrics.OnStep(0, 2, 128);
  metrics.OnStep(0, 3, 256);
  metrics.OnRecovery();
  // Synchronous: back to an earlier step of the epoch.
  metrics.OnStep(0, 2, 128);
  std::map<std::string, double> v = Values(registry);
  EXPECT_EQ(v["ps_worker_samples_total,rank=0"], 512);
  EXPECT_EQ(v["ps_worker_steps_total,rank=0"], 4);
  EXPECT_EQ(v["ps_worker_recoveries_total,rank=0"], 2);
}

TEST(WorkerMetricsTest, StalenessAddsWhatIsNewInTheStoresHistogram) {
  prometheus::Registry registry;
  WorkerMetrics metrics(registry);
  metrics.Bind(1);
  metrics.SetStaleness({{0, 2}, {3, 1}});
  metrics.SetStaleness({{0, 2}, {3, 2}, {200, 1}});
  std::map<std::string, double> v = Values(registry);
  EXPECT_EQ(v["ps_worker_push_staleness,rank=1"], 5);
  EXPECT_EQ(v["ps_worker_push_staleness_sum,rank=1"], 206);
  EXPECT_EQ(v["ps_worker_push_staleness_bucket,rank=1,le=0"], 2);
  EXPECT_EQ(v["ps_worker_push_staleness_bucket,rank=1,le=2"], 2);
  EXPECT_EQ(v["ps_worker_push_staleness_bucket,rank=1,le=4"], 4);
  EXPECT_EQ(v["ps_worker_push_staleness_bucket,rank=1,le=128"], 4);
}

// Holds every segment call until the test completes it.
class HeldStore final : public ParameterStore {
 public:
  absl::StatusOr<Registration> Register(const std::vector<ParamSpec>&,
                                        absl::Span<const float>) override {
    Registration r;
    r.rank = 2;
    r.num_workers = 4;
    r.version = 7;
    return r;
  }
  absl::StatusOr<Registration> Reconnect(const std::vector<ParamSpec>& signature,
                                         absl::Span<const float> proposed) override {
    ++reconnects;
    return Register(signature, proposed);
  }
  absl::Status Push(int64_t, int64_t, absl::Span<const float>) override {
    return absl::OkStatus();
  }
  absl::Status WaitForVersion(int64_t) override { return absl::OkStatus(); }
  absl::StatusOr<int64_t> Pull(int64_t version, absl::Span<float>) override { return version; }
  std::vector<int64_t> SegmentEnds() const override { return {10, 30, 30, 100}; }
  void PushSegments(int64_t, int64_t, int, int, absl::Span<const float>, Done done) override {
    held.push_back(std::move(done));
  }
  void PullSegments(int64_t, int, int, absl::Span<float>, Done done) override {
    held.push_back(std::move(done));
  }
  std::vector<Done> held;
  int reconnects = 0;
};

TEST(MeteredParameterStoreTest, CountsTheCallsInFlightAndThePulledVersion) {
  prometheus::Registry registry;
  WorkerMetrics metrics(registry);
  auto owned = std::make_unique<HeldStore>();
  HeldStore* held = owned.get();
  MeteredParameterStore store(std::move(owned), &metrics);
  ASSERT_TRUE(store.Register({}, {}).ok());
  EXPECT_EQ(Values(registry)["ps_worker_version,rank=2"], 7);
  std::vector<float> buffer(100);
  absl::Status pushed = absl::UnknownError("not done"), pulled = pushed, second = pushed;
  store.PushSegments(7, 32, 0, 2, buffer, [&](absl::Status s) { pushed = s; });
  store.PushSegments(7, 32, 2, 4, buffer, [&](absl::Status s) { second = s; });
  store.PullSegments(8, 1, 2, absl::MakeSpan(buffer), [&](absl::Status s) { pulled = s; });
  std::map<std::string, double> v = Values(registry);
  EXPECT_EQ(v["ps_worker_calls_in_flight,direction=push,rank=2"], 2);
  EXPECT_EQ(v["ps_worker_bytes_in_flight,direction=push,rank=2"], 400);  // 30 + 70 floats
  EXPECT_EQ(v["ps_worker_calls_in_flight,direction=pull,rank=2"], 1);
  EXPECT_EQ(v["ps_worker_bytes_in_flight,direction=pull,rank=2"], 80);
  ASSERT_EQ(held->held.size(), 3u);
  held->held[0](absl::OkStatus());
  held->held[1](absl::UnavailableError("lost"));
  held->held[2](absl::OkStatus());
  EXPECT_TRUE(pushed.ok());
  EXPECT_EQ(second.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(pulled.ok());
  v = Values(registry);
  EXPECT_EQ(v["ps_worker_calls_in_flight,direction=push,rank=2"], 0);
  EXPECT_EQ(v["ps_worker_bytes_in_flight,direction=push,rank=2"], 0);
  EXPECT_EQ(v["ps_worker_calls_in_flight,direction=pull,rank=2"], 0);
  EXPECT_EQ(v["ps_worker_calls_total,direction=push,rank=2"], 2);
  EXPECT_EQ(v["ps_worker_calls_total,direction=pull,rank=2"], 1);
  EXPECT_EQ(v["ps_worker_version,rank=2"], 8);
  // A reconnection keeps the rank and its series.
  ASSERT_TRUE(store.Reconnect({}, {}).ok());
  EXPECT_EQ(held->reconnects, 1);
  EXPECT_EQ(Values(registry)["ps_worker_version,rank=2"], 7);
}

}  // namespace
}  // namespace ps::worker
