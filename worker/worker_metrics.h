#ifndef PS_WORKER_WORKER_METRICS_H_
#define PS_WORKER_WORKER_METRICS_H_

// A worker's own Prometheus metrics, for its --metrics_port endpoint
// (common/metrics.h serves them). Every series carries the worker's rank,
// once registration has given it:
//   ps_worker_phase_seconds{rank,phase}       histogram of each step phase
//   ps_worker_rpc_bytes_total{rank,kind}      payload bytes of its push and
//                                             pull messages (kind
//                                             push_message, pull_message)
//   ps_worker_rpc_seconds{rank,kind}          histogram of those messages
//   ps_worker_events_total{rank,kind}         every timed event, by kind
//     (the four above: EventMetrics over the trainer's and the store's
//     timed events, common/timed_event.h; no timers of their own)
//   ps_worker_steps_total{rank}               steps trained (a step trained
//                                             again after a recovery counts
//                                             again)
//   ps_worker_samples_total{rank}             samples trained (rate(): this
//                                             worker's samples/s)
//   ps_worker_version{rank}                   the version its last pull asked
//                                             for (synchronous: the server's;
//                                             asynchronous: its own step)
//   ps_worker_recoveries_total{rank}          reconnections to a lost server
//   ps_worker_push_staleness{rank}            asynchronous: histogram of how
//                                             many updates each push message
//                                             was behind, from the server's
//                                             replies
//   ps_worker_calls_in_flight{rank,direction} the push/pull pipeline's
//                                             segment calls the store has
//                                             started and not completed
//                                             (direction push, pull)
//   ps_worker_bytes_in_flight{rank,direction} their bytes (fp32, as
//                                             --max_bytes_in_flight bounds
//                                             them)
//   ps_worker_calls_total{rank,direction}     segment calls started
// The in-flight gauges and the version come from MeteredParameterStore
// below, wrapped around the worker's store.
//
// Thread-safe: events and calls arrive from the trainer's, the devices' and
// gRPC's threads. The registry must outlive it.

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics.h"
#include "common/timed_event.h"
#include "worker/parameter_store.h"

namespace ps::worker {

class WorkerMetrics final : public EventObserver {
 public:
  enum class Direction { kPush = 0, kPull = 1 };

  // Registers the families (served at once, without series until Bind).
  explicit WorkerMetrics(prometheus::Registry& registry);
  ~WorkerMetrics() override;

  // Labels everything from now on with `rank` (the registration's; again
  // after a reconnection, which keeps it). Until the first Bind, events and
  // calls are not counted: only rank 0's initial parameters travel then.
  void Bind(int rank);

  // The trainer's and the store's timed events.
  void OnEvent(const TimedEvent& event) override;

  // After each step (Trainer's step callback): `epoch_samples` is this
  // worker's samples of the epoch so far (StepProgress), counted from 0
  // again in a new epoch and after a recovery.
  void OnStep(int64_t epoch, int64_t step_in_epoch, int64_t epoch_samples);
  // After each recovery from a lost server.
  void OnRecovery();
  void SetVersion(int64_t version);
  // The store's staleness histogram so far (RemoteParameterStore::
  // staleness_histogram: messages by updates behind); what is new since the
  // last call is added to ps_worker_push_staleness.
  void SetStaleness(const std::map<int64_t, int64_t>& messages_by_staleness);

  // One rank's series (opaque).
  struct Series;
  // A segment call of `bytes` started; pass the result to EndCall once it
  // completes (the call stays on the rank it started under).
  struct Call {
    Series* series = nullptr;  // null before Bind: not counted
    Direction direction = Direction::kPush;
    int64_t bytes = 0;
  };
  Call StartCall(Direction direction, int64_t bytes);
  void EndCall(const Call& call);

 private:
  prometheus::Registry& registry_;
  prometheus::Family<prometheus::Counter>& steps_;
  prometheus::Family<prometheus::Counter>& samples_;
  prometheus::Family<prometheus::Gauge>& version_;
  prometheus::Family<prometheus::Counter>& recoveries_;
  prometheus::Family<prometheus::Histogram>& staleness_;
  prometheus::Family<prometheus::Gauge>& calls_in_flight_;
  prometheus::Family<prometheus::Gauge>& bytes_in_flight_;
  prometheus::Family<prometheus::Counter>& calls_total_;

  absl::Mutex mu_;
  // Every rank bound so far (a call or event may still hold an old one).
  std::vector<std::unique_ptr<Series>> series_ ABSL_GUARDED_BY(mu_);
  std::atomic<Series*> current_{nullptr};
  // OnStep's last call, and whether a recovery came since.
  int64_t last_epoch_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t last_epoch_samples_ ABSL_GUARDED_BY(mu_) = 0;
  bool recovered_ ABSL_GUARDED_BY(mu_) = false;
  std::map<int64_t, int64_t> last_staleness_ ABSL_GUARDED_BY(mu_);
};

// A parameter store that forwards every call to `store` and reports to
// `metrics`: the registration's rank (Bind) and version, each pull's
// version, and the segment calls in flight. Same contract as the store it
// wraps (parameter_store.h); a method added to ParameterStore later must be
// forwarded here too. Both must outlive it; it owns `store`.
class MeteredParameterStore final : public ParameterStore {
 public:
  MeteredParameterStore(std::unique_ptr<ParameterStore> store, WorkerMetrics* metrics);

  absl::StatusOr<Registration> Register(const std::vector<ParamSpec>& signature,
                                        absl::Span<const float> proposed) override;
  absl::Status Push(int64_t iteration, int64_t num_samples,
                    absl::Span<const float> gradient) override;
  absl::Status WaitForVersion(int64_t version) override;
  absl::StatusOr<int64_t> Pull(int64_t version, absl::Span<float> params) override;
  std::vector<int64_t> SegmentEnds() const override;
  std::vector<int> SegmentStreams() const override;
  void PushSegments(int64_t iteration, int64_t num_samples, int first, int last,
                    absl::Span<const float> gradient, Done done) override;
  void PullSegments(int64_t version, int first, int last, absl::Span<float> params,
                    Done done) override;
  absl::StatusOr<std::vector<int>> Members(int64_t iteration, int num_workers) override;
  absl::StatusOr<Registration> Reconnect(const std::vector<ParamSpec>& signature,
                                         absl::Span<const float> proposed) override;
  absl::Status BindBuffers(absl::Span<const float> gradients, absl::Span<float> params) override;
  float LossScale() const override { return store_->LossScale(); }

 private:
  // Bytes of segments [first, last) (0 for a range the store will refuse).
  int64_t SegmentBytes(int first, int last) const;
  void Registered(const Registration& registration);

  const std::unique_ptr<ParameterStore> store_;
  WorkerMetrics* const metrics_;
  // The store's segment ends, read at each registration (no segment call
  // in flight then); the segment calls, from any thread, only read them.
  std::vector<int64_t> ends_;
};

}  // namespace ps::worker

#endif  // PS_WORKER_WORKER_METRICS_H_
