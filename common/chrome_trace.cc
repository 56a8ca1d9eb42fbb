#include "common/chrome_trace.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace ps {
namespace {

// ordered_json keeps keys in insertion order: every event reads
// name, cat, ph, ts, dur, pid, tid, args, as in Chrome's documentation.
using Json = nlohmann::ordered_json;

Json Metadata(const char* name, int64_t pid, int64_t tid, Json args) {
  Json m;
  m["name"] = name;
  m["ph"] = "M";
  m["pid"] = pid;
  m["tid"] = tid;
  m["args"] = std::move(args);
  return m;
}

absl::Status WriteError(const std::string& path, const std::string& what, int error) {
  return absl::UnavailableError(
      absl::StrCat("cannot write trace to ", path, ": ", what, ": ", std::strerror(error)));
}

}  // namespace

ChromeTraceObserver::ChromeTraceObserver(ChromeTraceOptions options)
    : max_events_(std::max<int64_t>(0, options.max_events)),
      origin_ns_(options.origin_ns),
      pid_(options.pid),
      process_name_(std::move(options.process_name)) {}

void ChromeTraceObserver::OnEvent(const TimedEvent& event) {
  // The name is copied before the lock is taken, so the lock covers only
  // the push_back.
  Recorded r{event.kind,   event.lane,  event.step, event.start_ns,
             event.end_ns, event.bytes, std::string(event.name)};
  absl::MutexLock lock(&mu_);
  if (static_cast<int64_t>(events_.size()) >= max_events_) {
    ++dropped_;
    return;
  }
  events_.push_back(std::move(r));
}

void ChromeTraceObserver::set_process(int64_t pid, std::string process_name) {
  absl::MutexLock lock(&mu_);
  pid_ = pid;
  process_name_ = std::move(process_name);
}

int64_t ChromeTraceObserver::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(events_.size());
}

int64_t ChromeTraceObserver::dropped() const {
  absl::MutexLock lock(&mu_);
  return dropped_;
}

std::string ChromeTraceObserver::ToJson() const {
  // 1. Take a copy under the lock; the JSON is built without it, so
  //    producers are not held up by a large write.
  std::vector<Recorded> events;
  int64_t pid, dropped;
  std::string process_name;
  {
    absl::MutexLock lock(&mu_);
    events.assign(events_.begin(), events_.end());
    pid = pid_;
    dropped = dropped_;
    process_name = process_name_.empty() ? absl::StrCat("process ", pid_) : process_name_;
  }

  // 2. Order by start; an enclosing event before the events it encloses.
  std::stable_sort(events.begin(), events.end(), [](const Recorded& a, const Recorded& b) {
    if (a.start_ns != b.start_ns) return a.start_ns < b.start_ns;
    return a.end_ns > b.end_ns;
  });
  int64_t origin = origin_ns_;
  if (origin == ChromeTraceOptions::kFirstEvent) origin = events.empty() ? 0 : events[0].start_ns;

  // 3. Metadata: the process, then each lane seen, by lane.
  std::vector<Json> lines;
  lines.reserve(1 + 2 * 8 + events.size());
  lines.push_back(Metadata("process_name", pid, 0, Json{{"name", process_name}}));
  std::set<int32_t> lanes;
  for (const Recorded& e : events) lanes.insert(e.lane);
  for (int32_t lane : lanes) {
    lines.push_back(Metadata("thread_name", pid, lane, Json{{"name", LaneName(lane)}}));
    lines.push_back(Metadata("thread_sort_index", pid, lane, Json{{"sort_index", lane}}));
  }

  // 4. The events.
  for (const Recorded& e : events) {
    const std::string kind(EventKindName(e.kind));
    Json x;
    x["name"] = e.name.empty() ? kind : e.name;
    x["cat"] = kind;
    x["ph"] = "X";
    x["ts"] = static_cast<double>(e.start_ns - origin) / 1e3;
    x["dur"] = static_cast<double>(e.end_ns - e.start_ns) / 1e3;
    x["pid"] = pid;
    x["tid"] = e.lane;
    x["args"] = Json{{"step", e.step}, {"bytes", e.bytes}};
    lines.push_back(std::move(x));
  }

  // 5. One event per line, so the file greps and diffs; names come from
  //    layers and tensors, so invalid UTF-8 is replaced rather than thrown.
  auto dump = [](const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); };
  std::string out = "{\"traceEvents\":[\n";
  for (size_t i = 0; i < lines.size(); ++i) {
    absl::StrAppend(&out, dump(lines[i]), i + 1 < lines.size() ? ",\n" : "\n");
  }
  const Json other{{"clock_origin_ns", origin}, {"dropped_events", dropped}};
  absl::StrAppend(&out, "],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":", dump(other), "}\n");
  return out;
}

absl::Status ChromeTraceObserver::WriteTo(const std::string& path) const {
  const std::string json = ToJson();
  const std::string tmp_path = path + ".tmp";
  {
    std::ofstream out(tmp_path, std::ios::binary | std::ios::trunc);
    if (!out) return WriteError(path, absl::StrCat("cannot create ", tmp_path), errno);
    out << json;
    out.close();
    if (!out) {
      const int error = errno;
      std::remove(tmp_path.c_str());
      return WriteError(path, absl::StrCat("cannot write ", tmp_path), error);
    }
  }
  if (std::rename(tmp_path.c_str(), path.c_str()) != 0) {
    const int error = errno;
    std::remove(tmp_path.c_str());
    return WriteError(path, absl::StrCat("cannot rename ", tmp_path, " to it"), error);
  }
  return absl::OkStatus();
}

}  // namespace ps
