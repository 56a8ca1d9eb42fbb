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

EventMetrics::EventMetrics(prometheus::Registry& registry, const std::string& prefix,
                           prometheus::Labels labels)
    : labels_(std::move(labels)),
      phases_(prometheus::BuildHistogram()
                  .Name(prefix + "_phase_seconds")
                  .Help("Time of each step phase (data, compute, reduce, copy to host, push, "
                        "wait, pull, copy to device), in seconds")
                  .Register(registry)),
      rpc_bytes_(prometheus::BuildCounter()
                     .Name(prefix + "_rpc_bytes_total")
                     .Help("Payload bytes of push and pull messages")
                     .Register(registry)),
      rpc_seconds_(prometheus::BuildHistogram()
                       .Name(prefix + "_rpc_seconds")
                       .Help("Time of each push and pull message, in seconds")
                       .Register(registry)),
      events_(prometheus::BuildCounter()
                  .Name(prefix + "_events_total")
                  .Help("Timed events, by kind")
                  .Register(registry)) {}

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
