#include "server/stall_report.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace ps::server {
namespace {

std::string Ago(int64_t then_ns, int64_t now_ns) {
  if (then_ns < 0) return "never";
  return absl::StrFormat("%.1f s ago", static_cast<double>(now_ns - then_ns) / 1e9);
}

}  // namespace

Stall FindStall(const JobProgress& progress, int64_t now_ns,
                absl::Duration report_after, absl::Duration liveness_timeout) {
  Stall stall;
  stall.iteration = progress.version;
  if (!progress.initialized || progress.version_ns < 0) return stall;
  stall.waited = absl::Nanoseconds(now_ns - progress.version_ns);
  if (stall.waited < report_after) return stall;
  const int64_t liveness_ns = absl::ToInt64Nanoseconds(liveness_timeout);
  std::vector<std::string> parts;
  int complete = 0;
  for (const WorkerProgress& w : progress.workers) {
    if (w.dropped) continue;  // not expected
    if (!w.id.empty() && w.pushed_chunks >= progress.total_chunks) {
      ++complete;
      continue;
    }
    stall.missing.push_back(w.rank);
    const bool lost = w.id.empty() || w.heard_ns < 0 || now_ns - w.heard_ns > liveness_ns;
    if (lost) stall.lost.push_back(w.rank);
    if (w.id.empty()) {
      parts.push_back(absl::StrCat("rank ", w.rank, " (no worker registered)"));
      continue;
    }
    std::string part = absl::StrCat("rank ", w.rank, " (worker '", w.id, "') pushed ",
                                    w.pushed_chunks, " of ", progress.total_chunks,
                                    " chunks, last heard ", Ago(w.heard_ns, now_ns));
    if (lost) {
      absl::StrAppend(&part, " (lost: nothing for more than ",
                      absl::FormatDuration(liveness_timeout), ")");
    }
    absl::StrAppend(&part, ", last pushed ",
                    w.last_push_iteration < 0
                        ? std::string("nothing")
                        : absl::StrCat("iteration ", w.last_push_iteration, " ",
                                       Ago(w.last_push_ns, now_ns)));
    parts.push_back(std::move(part));
  }
  // All pushed: the update is under way. None pushed and none lost: every
  // worker is still computing (a slow step), nobody waits.
  if (stall.missing.empty() || (complete == 0 && stall.lost.empty())) return stall;
  stall.report = absl::StrFormat(
      "stall: iteration %d has waited %.1f s for %s; %d of %d ranks have pushed it all",
      progress.version, absl::ToDoubleSeconds(stall.waited), absl::StrJoin(parts, "; "), complete,
      static_cast<int>(progress.workers.size()));
  return stall;
}

}  // namespace ps::server
