#ifndef PS_WORKER_TIME_SPLIT_H_
#define PS_WORKER_TIME_SPLIT_H_

// Where a worker's step time goes: the step phases of the trainer lane
// (common/timed_event.h), summed. The first consumer of the trainer's events.

#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/timed_event.h"

namespace ps::worker {

// Seconds of one step's phases, summed over the steps measured.
struct TimeSplit {
  double data = 0;     // gathering the batch and copying it to the devices
  double compute = 0;  // forward, loss and backward on every device
  double reduce = 0;   // summing the devices' gradients on the devices
  double copy = 0;     // device->host gradients and host->device parameters,
                       // and the broadcast to the other devices
  double push = 0;
  double wait = 0;  // waiting for the other workers' pushes
  double pull = 0;
};

// to += from, field by field.
void AddSplit(TimeSplit* to, const TimeSplit& from);

// One step phase's events since the start: how many, and their durations
// summed in nanoseconds (the worker's heartbeats report these to the
// server's metrics).
struct PhaseSum {
  EventKind kind = EventKind::kData;
  int64_t nanoseconds = 0;
  int64_t count = 0;
};

// Sums the durations of the step phases reported on kTrainerLane (kData ..
// kCopyToDevice) into a TimeSplit: copy is kCopyToHost + kCopyToDevice, every
// other field its phase. Events on other lanes and detail events (layers,
// RPC messages) are ignored. Durations are summed in integer nanoseconds and
// converted once, in split(): seconds = nanoseconds / 1e9.
//
// Thread-safe: OnEvent, split() and Reset() may be called from any thread.
class TimeSplitObserver final : public EventObserver {
 public:
  void OnEvent(const TimedEvent& event) override;

  // The sums since construction or the last Reset().
  TimeSplit split() const;
  // The same sums kept apart by phase, with their event counts: every phase
  // reported at least once, in EventKind order.
  std::vector<PhaseSum> phase_sums() const;
  void Reset();

 private:
  mutable absl::Mutex mu_;
  int64_t phase_ns_[kNumEventKinds] ABSL_GUARDED_BY(mu_) = {};
  int64_t phase_count_[kNumEventKinds] ABSL_GUARDED_BY(mu_) = {};
};

}  // namespace ps::worker

#endif  // PS_WORKER_TIME_SPLIT_H_
