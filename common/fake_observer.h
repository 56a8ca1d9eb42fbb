#ifndef PS_COMMON_FAKE_OBSERVER_H_
#define PS_COMMON_FAKE_OBSERVER_H_

// A test double for the observer seam: keeps every event it is given.

#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/timed_event.h"

namespace ps {

// Records every event in arrival order, with its name copied (TimedEvent::name
// is valid during OnEvent only, so the kept events' names are cleared; names()
// holds them). Thread-safe.
class RecordingObserver final : public EventObserver {
 public:
  void OnEvent(const TimedEvent& event) override {
    absl::MutexLock lock(&mu_);
    events_.push_back(event);
    events_.back().name = {};
    names_.emplace_back(event.name);
  }
  std::vector<TimedEvent> events() const {
    absl::MutexLock lock(&mu_);
    return events_;
  }
  // names()[i] is events()[i]'s name.
  std::vector<std::string> names() const {
    absl::MutexLock lock(&mu_);
    return names_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<TimedEvent> events_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> names_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps

#endif  // PS_COMMON_FAKE_OBSERVER_H_
