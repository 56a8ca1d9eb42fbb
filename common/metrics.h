#ifndef PS_COMMON_METRICS_H_
#define PS_COMMON_METRICS_H_

// Prometheus metrics over HTTP (Debian's prometheus-cpp: its core registry
// and its civetweb exposer), for both daemons' --metrics_port. A
// MetricsServer owns the HTTP endpoint (GET /metrics) and the registry the
// daemon's metrics live in; EventMetrics turns the timed events every
// component already reports (common/timed_event.h) into metrics, so nothing
// on the data path knows Prometheus.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/timed_event.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace ps {

class MetricsServer {
 public:
  // Serves the registry at http://`address`/metrics ("host:port"; port 0
  // picks a free one). kUnavailable naming the address when it cannot bind
  // or civetweb cannot start its threads. Linking this library raises every
  // thread stack a caller sizes by the static TLS (common/thread_stack.h):
  // civetweb's fixed 100 KiB could not hold a CUDA process's.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& address);

  int port() const { return port_; }
  prometheus::Registry& registry() { return *registry_; }

 private:
  MetricsServer() = default;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
};

// The family `builder` (prometheus::BuildCounter() and the like) registers
// in `registry` under `name`, with `help`.
template <typename Builder>
auto& RegisterFamily(Builder builder, const std::string& name, const std::string& help,
                     prometheus::Registry& registry) {
  return builder.Name(name).Help(help).Register(registry);
}

// The buckets of push staleness, counted in updates or iterations behind:
// the server's ps_server_push_staleness and the workers' histograms share
// them, so that their series line up.
const prometheus::Histogram::BucketBoundaries& StalenessBuckets();

// Timed events as metrics, under `prefix` ("ps_worker", "ps_server"), each
// series also carrying `labels` (a worker's {rank}):
//   <prefix>_phase_seconds{phase}   histogram of each step phase (kData ..
//                                   kCopyToDevice: where the step time goes)
//   <prefix>_rpc_bytes_total{kind}  payload bytes of push and pull messages
//   <prefix>_rpc_seconds{kind}      histogram of push and pull messages
//   <prefix>_events_total{kind}     every event, by kind
// Several EventMetrics with one prefix share the families (the registry
// merges them), apart by their labels. Thread-safe (prometheus-cpp's
// metrics are); the registry must outlive it.
class EventMetrics final : public EventObserver {
 public:
  EventMetrics(prometheus::Registry& registry, const std::string& prefix,
               prometheus::Labels labels = {});
  void OnEvent(const TimedEvent& event) override;

 private:
  // `labels_` and {name: value}.
  prometheus::Labels With(const std::string& name, const std::string& value) const;

  const prometheus::Labels labels_;
  prometheus::Family<prometheus::Histogram>& phases_;
  prometheus::Family<prometheus::Counter>& rpc_bytes_;
  prometheus::Family<prometheus::Histogram>& rpc_seconds_;
  prometheus::Family<prometheus::Counter>& events_;
};

}  // namespace ps

#endif  // PS_COMMON_METRICS_H_
