#ifndef PS_COMMON_TIMED_EVENT_H_
#define PS_COMMON_TIMED_EVENT_H_

// The one observer seam for timing: every timed event of a training step (a
// phase of the step, one layer's forward or backward pass, one push or pull
// message) is reported to an EventObserver. The worker's time split, Chrome
// trace timelines and Prometheus metrics are consumers of these events, not
// separate sets of timers.
//
// Lanes are the rows of a timeline and stay stable for a process's life: the
// trainer's own thread, one lane per device (its long-lived thread), and one
// lane per concurrent RPC stream; on the parameter server, one lane per
// worker rank for its pushes, one for the updates and one for the pulls.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/clock.h"

namespace ps {

enum class EventKind : uint8_t {
  // Phases of a step, on the trainer lane; they do not overlap one another,
  // so their durations add up to the step time.
  kData,          // gathering this worker's shards and copying them to the devices
  kCompute,       // forward, loss and backward on every device
  kReduce,        // summing the devices' gradients on the devices
  kCopyToHost,    // the summed gradient, device 0 -> host
  kPush,          // pushing the gradient, all messages
  kWait,          // waiting for the other workers' pushes
  kPull,          // pulling the new parameters, all messages
  kCopyToDevice,  // host -> device 0 and the broadcast to the other devices
  // Details, on device and RPC lanes; they overlap the phases above.
  kForward,       // one layer's forward pass (name: the layer)
  kBackward,      // one layer's backward pass (name: the layer)
  kPushMessage,   // one push RPC (name: its first tensor; bytes: payload)
  kPullMessage,   // one pull RPC (name: its first tensor; bytes: payload)
  // The parameter server's work, on its lanes.
  kServerPush,    // checking and summing one push message (name: its first
                  // tensor; bytes: payload)
  kServerUpdate,  // the optimizer's update of one chunk, once every worker
                  // has pushed it, and publishing it (name: its tensor;
                  // bytes: the chunk's)
  kServerPull,    // copying one pull message out (name: its first tensor;
                  // bytes: payload)
};
constexpr int kNumEventKinds = 15;

// "data", "compute", ..., "pull_message", "server_push", "server_update",
// "server_pull": stable, for reports and metric labels.
absl::string_view EventKindName(EventKind kind);
// True for the step phases (kData .. kCopyToDevice).
bool IsStepPhase(EventKind kind);

// Lane numbers: kTrainerLane, DeviceLane(d), RpcLane(s) on a worker;
// kServerUpdateLane, kServerPullLane, ServerPushLane(rank) on the server
// (pulls carry no rank, and the server copies them out one at a time, so one
// lane holds them all).
constexpr int32_t kTrainerLane = 0;
constexpr int32_t DeviceLane(int device) { return 1 + device; }
constexpr int32_t RpcLane(int stream) { return (1 << 16) + stream; }
constexpr int32_t kServerUpdateLane = 2 << 16;
constexpr int32_t kServerPullLane = kServerUpdateLane + 1;
constexpr int32_t ServerPushLane(int rank) { return kServerUpdateLane + 2 + rank; }
// "trainer", "device 1", "rpc 3", "update", "pulls", "pushes of rank 2".
std::string LaneName(int32_t lane);

struct TimedEvent {
  EventKind kind = EventKind::kData;
  int32_t lane = kTrainerLane;
  int64_t step = -1;       // the iteration the event belongs to; -1 outside steps
  absl::string_view name;  // layer or tensor name, may be empty; valid during OnEvent only
  int64_t start_ns = 0;    // Clock::NowNanos() of the clock the producer was given
  int64_t end_ns = 0;
  int64_t bytes = 0;       // payload moved, 0 when not a transfer
};

// Receives events. OnEvent is called from several threads at once (device
// threads, RPC completion threads) while the step runs: implementations are
// thread-safe, fast and never block for long.
class EventObserver {
 public:
  virtual ~EventObserver() = default;
  virtual void OnEvent(const TimedEvent& event) = 0;
};

// Forwards every event to each observer in turn. The observers must outlive
// it; the list is fixed before events flow.
class ObserverFanOut final : public EventObserver {
 public:
  void Add(EventObserver* observer) { observers_.push_back(observer); }
  bool empty() const { return observers_.empty(); }
  void OnEvent(const TimedEvent& event) override {
    for (EventObserver* o : observers_) o->OnEvent(event);
  }

 private:
  std::vector<EventObserver*> observers_;
};

// For events whose start and end are decided apart (say, timed from a lock
// taken to a result published), bound to one observer (which may be null:
// then nothing is read or reported) and its clock (not null when the
// observer is set).
class EventTimer {
 public:
  EventTimer(EventObserver* observer, const Clock* clock) : observer_(observer), clock_(clock) {}
  bool observed() const { return observer_ != nullptr; }
  // The clock's reading, or -1 without a clock (bookkeeping, not events).
  int64_t NowNanos() const { return clock_ != nullptr ? clock_->NowNanos() : -1; }
  // The start of an event: the clock's reading when observed, else 0.
  int64_t Start() const { return observer_ != nullptr ? clock_->NowNanos() : 0; }
  // The event from `start_ns` to now, reported when observed.
  void ReportSince(EventKind kind, int32_t lane, int64_t step, absl::string_view name,
                   int64_t bytes, int64_t start_ns) const;

 private:
  EventObserver* const observer_;
  const Clock* const clock_;
};

// Times a scope: reports one event, from construction to destruction, when
// `observer` is non-null; costs two clock reads otherwise nothing.
class ScopedEvent {
 public:
  ScopedEvent(EventObserver* observer, const Clock* clock, EventKind kind, int32_t lane,
              int64_t step, absl::string_view name = {}, int64_t bytes = 0)
      : observer_(observer), clock_(clock) {
    event_.kind = kind;
    event_.lane = lane;
    event_.step = step;
    event_.name = name;
    event_.bytes = bytes;
    if (observer_ != nullptr) event_.start_ns = clock_->NowNanos();
  }
  ~ScopedEvent() {
    if (observer_ == nullptr) return;
    event_.end_ns = clock_->NowNanos();
    observer_->OnEvent(event_);
  }
  ScopedEvent(const ScopedEvent&) = delete;
  ScopedEvent& operator=(const ScopedEvent&) = delete;

 private:
  EventObserver* const observer_;
  const Clock* const clock_;
  TimedEvent event_;
};

}  // namespace ps

#endif  // PS_COMMON_TIMED_EVENT_H_
