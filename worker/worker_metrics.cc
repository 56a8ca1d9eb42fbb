#include "worker/worker_metrics.h"

#include <algorithm>
#include <string>
#include <utility>

namespace ps::worker {
namespace {

const char* DirectionName(WorkerMetrics::Direction direction) {
  return direction == WorkerMetrics::Direction::kPush ? "push" : "pull";
}

}  // namespace

struct WorkerMetrics::Series {
  std::unique_ptr<EventMetrics> events;
  prometheus::Counter* steps = nullptr;
  prometheus::Counter* samples = nullptr;
  prometheus::Gauge* version = nullptr;
  prometheus::Counter* recoveries = nullptr;
  prometheus::Histogram* staleness = nullptr;
  // By Direction.
  prometheus::Gauge* calls_in_flight[2] = {};
  prometheus::Gauge* bytes_in_flight[2] = {};
  prometheus::Counter* calls_total[2] = {};
  int rank = -1;
};

WorkerMetrics::WorkerMetrics(prometheus::Registry& registry)
    : registry_(registry),
      steps_(RegisterFamily(prometheus::BuildCounter(), "ps_worker_steps_total",
                            "Steps this worker trained", registry)),
      samples_(RegisterFamily(prometheus::BuildCounter(), "ps_worker_samples_total",
                              "Samples this worker trained", registry)),
      version_(
          RegisterFamily(prometheus::BuildGauge(), "ps_worker_version",
                         "The parameter version this worker's last pull asked for (asynchronous: "
                         "its own step)",
                         registry)),
      recoveries_(RegisterFamily(prometheus::BuildCounter(), "ps_worker_recoveries_total",
                                 "Reconnections to a lost server", registry)),
      staleness_(RegisterFamily(prometheus::BuildHistogram(), "ps_worker_push_staleness",
                                "Asynchronous consistency: updates each push message's chunks had "
                                "received since the version it was computed from",
                                registry)),
      calls_in_flight_(RegisterFamily(prometheus::BuildGauge(), "ps_worker_calls_in_flight",
                                      "Push and pull segment calls of the pipeline started and not "
                                      "completed",
                                      registry)),
      bytes_in_flight_(RegisterFamily(prometheus::BuildGauge(), "ps_worker_bytes_in_flight",
                                      "Bytes (fp32) of the push and pull segment calls in flight",
                                      registry)),
      calls_total_(RegisterFamily(prometheus::BuildCounter(), "ps_worker_calls_total",
                                  "Push and pull segment calls of the pipeline started",
                                  registry)) {}

WorkerMetrics::~WorkerMetrics() = default;

void WorkerMetrics::Bind(int rank) {
  absl::MutexLock lock(&mu_);
  for (const std::unique_ptr<Series>& s : series_) {
    if (s->rank == rank) {
      current_ = s.get();
      return;
    }
  }
  auto s = std::make_unique<Series>();
  s->rank = rank;
  const prometheus::Labels labels = {{"rank", std::to_string(rank)}};
  s->events = std::make_unique<EventMetrics>(registry_, "ps_worker", labels);
  s->steps = &steps_.Add(labels);
  s->samples = &samples_.Add(labels);
  s->version = &version_.Add(labels);
  s->recoveries = &recoveries_.Add(labels);
  s->staleness = &staleness_.Add(labels, StalenessBuckets());
  for (const Direction d : {Direction::kPush, Direction::kPull}) {
    prometheus::Labels with = labels;
    with["direction"] = DirectionName(d);
    const int i = static_cast<int>(d);
    s->calls_in_flight[i] = &calls_in_flight_.Add(with);
    s->bytes_in_flight[i] = &bytes_in_flight_.Add(with);
    s->calls_total[i] = &calls_total_.Add(with);
  }
  current_ = s.get();
  series_.push_back(std::move(s));
}

void WorkerMetrics::OnEvent(const TimedEvent& event) {
  Series* s = current_.load();
  if (s != nullptr) s->events->OnEvent(event);
}

void WorkerMetrics::OnStep(int64_t epoch, int64_t step_in_epoch, int64_t epoch_samples) {
  absl::MutexLock lock(&mu_);
  // The trainer counts an epoch's samples from 0 again in a new epoch and
  // after a recovery.
  const bool fresh = recovered_ || epoch != last_epoch_;
  const int64_t samples = fresh ? epoch_samples : epoch_samples - last_epoch_samples_;
  last_epoch_ = epoch;
  last_epoch_samples_ = epoch_samples;
  recovered_ = false;
  Series* s = current_.load();
  if (s == nullptr) return;
  s->steps->Increment();
  s->samples->Increment(static_cast<double>(std::max<int64_t>(0, samples)));
}

void WorkerMetrics::OnRecovery() {
  absl::MutexLock lock(&mu_);
  recovered_ = true;
  Series* s = current_.load();
  if (s != nullptr) s->recoveries->Increment();
}

void WorkerMetrics::SetVersion(int64_t version) {
  Series* s = current_.load();
  if (s != nullptr) s->version->Set(static_cast<double>(version));
}

void WorkerMetrics::SetStaleness(const std::map<int64_t, int64_t>& messages_by_staleness) {
  absl::MutexLock lock(&mu_);
  Series* s = current_.load();
  if (s == nullptr) return;
  const prometheus::Histogram::BucketBoundaries& bounds = StalenessBuckets();
  std::vector<double> increments(bounds.size() + 1, 0);
  double sum = 0;
  bool added = false;
  for (const auto& [staleness, messages] : messages_by_staleness) {
    const auto last = last_staleness_.find(staleness);
    const int64_t before = last == last_staleness_.end() ? 0 : last->second;
    const int64_t n = messages - before;
    if (n <= 0) continue;
    // Prometheus buckets count the values <= their bound; the last is +Inf.
    const size_t bucket = static_cast<size_t>(
        std::lower_bound(bounds.begin(), bounds.end(), static_cast<double>(staleness)) -
        bounds.begin());
    increments[bucket] += static_cast<double>(n);
    sum += static_cast<double>(n) * static_cast<double>(staleness);
    added = true;
  }
  last_staleness_ = messages_by_staleness;
  if (added) s->staleness->ObserveMultiple(increments, sum);
}

WorkerMetrics::Call WorkerMetrics::StartCall(Direction direction, int64_t bytes) {
  Call call;
  call.series = current_.load();
  call.direction = direction;
  call.bytes = bytes;
  if (call.series != nullptr) {
    const int i = static_cast<int>(direction);
    call.series->calls_total[i]->Increment();
    call.series->calls_in_flight[i]->Increment();
    call.series->bytes_in_flight[i]->Increment(static_cast<double>(bytes));
  }
  return call;
}

void WorkerMetrics::EndCall(const Call& call) {
  if (call.series == nullptr) return;
  const int i = static_cast<int>(call.direction);
  call.series->calls_in_flight[i]->Decrement();
  call.series->bytes_in_flight[i]->Decrement(static_cast<double>(call.bytes));
}

MeteredParameterStore::MeteredParameterStore(std::unique_ptr<ParameterStore> store,
                                             WorkerMetrics* metrics)
    : store_(std::move(store)), metrics_(metrics) {}

void MeteredParameterStore::Registered(const Registration& registration) {
  metrics_->Bind(registration.rank);
  metrics_->SetVersion(registration.version);
  ends_ = store_->SegmentEnds();
}

absl::StatusOr<ParameterStore::Registration> MeteredParameterStore::Register(
    const std::vector<ParamSpec>& signature, absl::Span<const float> proposed) {
  absl::StatusOr<Registration> registration = store_->Register(signature, proposed);
  if (registration.ok()) Registered(*registration);
  return registration;
}

absl::StatusOr<ParameterStore::Registration> MeteredParameterStore::Reconnect(
    const std::vector<ParamSpec>& signature, absl::Span<const float> proposed) {
  absl::StatusOr<Registration> registration = store_->Reconnect(signature, proposed);
  if (registration.ok()) Registered(*registration);
  return registration;
}

absl::Status MeteredParameterStore::Push(int64_t iteration, int64_t num_samples,
                                         absl::Span<const float> gradient) {
  return store_->Push(iteration, num_samples, gradient);
}

absl::Status MeteredParameterStore::WaitForVersion(int64_t version) {
  return store_->WaitForVersion(version);
}

absl::StatusOr<int64_t> MeteredParameterStore::Pull(int64_t version, absl::Span<float> params) {
  absl::StatusOr<int64_t> pulled = store_->Pull(version, params);
  if (pulled.ok()) metrics_->SetVersion(*pulled);
  return pulled;
}

std::vector<int64_t> MeteredParameterStore::SegmentEnds() const { return store_->SegmentEnds(); }
std::vector<int> MeteredParameterStore::SegmentStreams() const {
  return store_->SegmentStreams();
}

int64_t MeteredParameterStore::SegmentBytes(int first, int last) const {
  if (first < 0 || first > last || last > static_cast<int>(ends_.size())) return 0;
  if (first == last) return 0;
  const int64_t begin = first == 0 ? 0 : ends_[first - 1];
  return (ends_[last - 1] - begin) * static_cast<int64_t>(sizeof(float));
}

void MeteredParameterStore::PushSegments(int64_t iteration, int64_t num_samples, int first,
                                         int last, absl::Span<const float> gradient, Done done) {
  const WorkerMetrics::Call call =
      metrics_->StartCall(WorkerMetrics::Direction::kPush, SegmentBytes(first, last));
  store_->PushSegments(iteration, num_samples, first, last, gradient,
                       [metrics = metrics_, call, done = std::move(done)](absl::Status status) {
                         metrics->EndCall(call);
                         done(std::move(status));
                       });
}

void MeteredParameterStore::PullSegments(int64_t version, int first, int last,
                                         absl::Span<float> params, Done done) {
  const WorkerMetrics::Call call =
      metrics_->StartCall(WorkerMetrics::Direction::kPull, SegmentBytes(first, last));
  store_->PullSegments(
      version, first, last, params,
      [metrics = metrics_, call, version, done = std::move(done)](absl::Status status) {
        metrics->EndCall(call);
        if (status.ok()) metrics->SetVersion(version);
        done(std::move(status));
      });
}

absl::Status MeteredParameterStore::BindBuffers(absl::Span<const float> gradients,
                                                absl::Span<float> params) {
  return store_->BindBuffers(gradients, params);
}

absl::StatusOr<std::vector<int>> MeteredParameterStore::Members(int64_t iteration,
                                                                int num_workers) {
  return store_->Members(iteration, num_workers);
}

}  // namespace ps::worker
