#include "common/metrics.h"

#include <exception>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ps {
namespace {

// Seconds from 0.1 ms to a minute, about three buckets per decade.
prometheus::Histogram::BucketBoundaries SecondsBuckets() {
  return {1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2,
          0.1,  0.25,   0.5,  1,    2.5,    5,    10,   30,     60};
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& address) {
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->registry_ = std::make_shared<prometheus::Registry>();
  try {
    server->exposer_ = std::make_unique<prometheus::Exposer>(address);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address, ": ", e.what()));
  }
  server->exposer_->RegisterCollectable(server->registry_);
  const std::vector<int> ports = server->exposer_->GetListeningPorts();
  server->port_ = ports.empty() ? 0 : ports.front();
  return server;
}

const prometheus::Histogram::BucketBoundaries& StalenessBuckets() {
  static const auto* const buckets =
      new prometheus::Histogram::BucketBoundaries{0, 1, 2, 4, 8, 16, 32, 64, 128};
  return *buckets;
}

EventMetrics::EventMetrics(prometheus::Registry& registry, const std::string& prefix,
                           prometheus::Labels labels)
    : labels_(std::move(labels)),
      phases_(RegisterFamily(prometheus::BuildHistogram(), prefix + "_phase_seconds",
                             "Time of each step phase (data, compute, reduce, copy to host, "
                             "push, wait, pull, copy to device), in seconds",
                             registry)),
      rpc_bytes_(RegisterFamily(prometheus::BuildCounter(), prefix + "_rpc_bytes_total",
                                "Payload bytes of push and pull messages", registry)),
      rpc_seconds_(RegisterFamily(prometheus::BuildHistogram(), prefix + "_rpc_seconds",
                                  "Time of each push and pull message, in seconds", registry)),
      events_(RegisterFamily(prometheus::BuildCounter(), prefix + "_events_total",
                             "Timed events, by kind", registry)) {}

prometheus::Labels EventMetrics::With(const std::string& name, const std::string& value) const {
  prometheus::Labels labels = labels_;
  labels[name] = value;
  return labels;
}

void EventMetrics::OnEvent(const TimedEvent& event) {
  const std::string kind(EventKindName(event.kind));
  const double seconds = static_cast<double>(event.end_ns - event.start_ns) / 1e9;
  const prometheus::Labels by_kind = With("kind", kind);
  events_.Add(by_kind).Increment();
  if (IsStepPhase(event.kind) && event.lane == kTrainerLane) {
    phases_.Add(With("phase", kind), SecondsBuckets()).Observe(seconds);
  }
  if (event.kind == EventKind::kPushMessage || event.kind == EventKind::kPullMessage ||
      event.kind == EventKind::kServerPush || event.kind == EventKind::kServerPull) {
    rpc_bytes_.Add(by_kind).Increment(static_cast<double>(event.bytes));
    rpc_seconds_.Add(by_kind, SecondsBuckets()).Observe(seconds);
  }
}

}  // namespace ps
