#ifndef PS_COMMON_CHROME_TRACE_H_
#define PS_COMMON_CHROME_TRACE_H_

// Timelines: a consumer of the timed events (common/timed_event.h) that
// keeps them and writes a Chrome trace-event JSON file, the format Perfetto
// (ui.perfetto.dev) and chrome://tracing open. One file per process; a
// job's files merge into one timeline with deploy/trace/merge_traces.py.

#include <cstdint>
#include <deque>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/timed_event.h"

namespace ps {

struct ChromeTraceOptions {
  // The trace's process: "pid" of every event, and its "process_name"
  // (e.g. pid = the worker's rank and "worker 0"; a fixed id and "server").
  // Empty name: "process <pid>". Both can be set later (set_process).
  int64_t pid = 0;
  std::string process_name;
  // Events kept; later ones are dropped and counted (dropped()). Each kept
  // event costs about 80 bytes plus its name beyond 15 characters.
  int64_t max_events = 1000000;
  // The Clock::NowNanos() reading written as ts 0. kFirstEvent: the earliest
  // start of the kept events.
  int64_t origin_ns = kFirstEvent;
  static constexpr int64_t kFirstEvent = -1;
};

// Keeps every event it is given, up to options.max_events, and writes them
// as complete events ("ph": "X"):
//   name: the event's name (layer, first tensor), or EventKindName when it
//         has none;  cat: EventKindName;  pid: the process;  tid: the lane;
//   ts, dur: microseconds (fractional, nanosecond resolution), ts relative
//         to the origin;  args: {"step", "bytes"}.
// before them, metadata events ("ph": "M"): process_name, then thread_name
// (LaneName) and thread_sort_index (the lane) for each lane seen, by lane.
// The complete events follow sorted by start, an enclosing event (same
// start, later end) before what it encloses, otherwise in arrival order.
// "otherData" records the origin ("clock_origin_ns": the Clock reading of
// ts 0, so merge_traces.py lines up files of one host's processes, whose
// steady clocks agree) and "dropped_events".
//
// Thread-safe: OnEvent (a lock and a push_back; the name is copied, since
// TimedEvent::name is valid during the call only), set_process, the counts
// and WriteTo may be called from any thread at any time; WriteTo writes the
// events kept so far.
class ChromeTraceObserver final : public EventObserver {
 public:
  explicit ChromeTraceObserver(ChromeTraceOptions options = {});

  void OnEvent(const TimedEvent& event) override;

  // The process the file names, for a pid known only later (a worker's
  // rank, assigned at registration). Applies to every event, kept before or
  // after: the pid is written at WriteTo, not recorded per event.
  void set_process(int64_t pid, std::string process_name);

  int64_t size() const;     // events kept
  int64_t dropped() const;  // events dropped because max_events were kept

  // The trace as a JSON document (see the class comment).
  std::string ToJson() const;
  // Writes ToJson() to `path` atomically: to `path` + ".tmp", then renamed
  // over `path`, so a reader never sees half a file. kUnavailable naming the
  // path when it cannot be written.
  absl::Status WriteTo(const std::string& path) const;

 private:
  struct Recorded {
    EventKind kind;
    int32_t lane;
    int64_t step;
    int64_t start_ns;
    int64_t end_ns;
    int64_t bytes;
    std::string name;
  };

  const int64_t max_events_;
  const int64_t origin_ns_;
  mutable absl::Mutex mu_;
  int64_t pid_ ABSL_GUARDED_BY(mu_);
  std::string process_name_ ABSL_GUARDED_BY(mu_);
  // A deque: growing never moves the kept events, so a push_back under the
  // lock stays short.
  std::deque<Recorded> events_ ABSL_GUARDED_BY(mu_);
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ps

#endif  // PS_COMMON_CHROME_TRACE_H_
