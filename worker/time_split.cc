#include "worker/time_split.h"

namespace ps::worker {

void AddSplit(TimeSplit* to, const TimeSplit& from) {
  to->data += from.data;
  to->compute += from.compute;
  to->reduce += from.reduce;
  to->copy += from.copy;
  to->push += from.push;
  to->wait += from.wait;
  to->pull += from.pull;
}

void TimeSplitObserver::OnEvent(const TimedEvent& event) {
  if (event.lane != kTrainerLane || !IsStepPhase(event.kind)) return;
  absl::MutexLock lock(&mu_);
  phase_ns_[static_cast<int>(event.kind)] += event.end_ns - event.start_ns;
  ++phase_count_[static_cast<int>(event.kind)];
}

TimeSplit TimeSplitObserver::split() const {
  absl::MutexLock lock(&mu_);
  auto seconds = [this](EventKind kind) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return static_cast<double>(phase_ns_[static_cast<int>(kind)]) / 1e9;
  };
  TimeSplit s;
  s.data = seconds(EventKind::kData);
  s.compute = seconds(EventKind::kCompute);
  s.reduce = seconds(EventKind::kReduce);
  s.copy = static_cast<double>(phase_ns_[static_cast<int>(EventKind::kCopyToHost)] +
                               phase_ns_[static_cast<int>(EventKind::kCopyToDevice)]) /
           1e9;
  s.push = seconds(EventKind::kPush);
  s.wait = seconds(EventKind::kWait);
  s.pull = seconds(EventKind::kPull);
  return s;
}

std::vector<PhaseSum> TimeSplitObserver::phase_sums() const {
  absl::MutexLock lock(&mu_);
  std::vector<PhaseSum> sums;
  for (int kind = 0; kind < kNumEventKinds; ++kind) {
    if (phase_count_[kind] == 0) continue;
    sums.push_back({static_cast<EventKind>(kind), phase_ns_[kind], phase_count_[kind]});
  }
  return sums;
}

void TimeSplitObserver::Reset() {
  absl::MutexLock lock(&mu_);
  for (int64_t& ns : phase_ns_) ns = 0;
  for (int64_t& count : phase_count_) count = 0;
}

}  // namespace ps::worker
