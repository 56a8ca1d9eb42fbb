#include "server/job_supervisor.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "server/stall_report.h"

namespace ps::server {

JobSupervisor::JobSupervisor(JobSupervisorOptions options, SupervisedJob job)
    : options_(std::move(options)), job_(std::move(job)) {}

bool JobSupervisor::Tick() {
  if (failed_) return false;
  const JobProgress progress = job_.progress();
  const int64_t now = options_.clock->NowNanos();
  // Whom the iteration waits for, at once (a lost worker is acted on after
  // the liveness timeout, whatever the report's period); the report itself
  // once it has waited stall_report_every, and that often.
  const Stall stall = FindStall(progress, now, /*report_after=*/absl::ZeroDuration(),
                                options_.liveness_timeout);
  if (stall.report.empty()) return true;
  const int64_t every_ns = absl::ToInt64Nanoseconds(options_.stall_report_every);
  if (stall.waited >= options_.stall_report_every &&
      (last_report_ns_ < 0 || now - last_report_ns_ >= every_ns)) {
    options_.log(stall.report);
    last_report_ns_ = now;
  }
  for (const int rank : stall.lost) {
    const WorkerProgress& w = progress.workers[rank];
    switch (options_.policy->OnLost(rank, w, progress.version, now)) {
      case WorkerLossPolicy::Action::kKeepWaiting:
        break;
      case WorkerLossPolicy::Action::kDrop: {
        const absl::Status dropped = job_.drop(rank);
        options_.log(
            dropped.ok()
                ? absl::StrCat("dropped rank ", rank, " ('", w.id, "'), lost at iteration ",
                               progress.version,
                               ": the job goes on without it (its missing part of this "
                               "iteration, and of the next if already announced, left out), "
                               "the global batch split over the others; it rejoins at a step "
                               "boundary if it comes back")
                : absl::StrCat("cannot drop rank ", rank, ": ", dropped.message()));
        break;
      }
      case WorkerLossPolicy::Action::kFailJob: {
        const absl::Status failure = options_.policy->Failure(rank, w, progress.version, now);
        options_.log(std::string(failure.message()));
        failed_ = true;
        job_.fail(failure);
        return false;
      }
    }
  }
  return true;
}

}  // namespace ps::server
