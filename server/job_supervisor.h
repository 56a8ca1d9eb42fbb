#ifndef PS_SERVER_JOB_SUPERVISOR_H_
#define PS_SERVER_JOB_SUPERVISOR_H_

// The server's supervisor of a job (Horovod's stall inspector, for a
// parameter server): while an iteration waits for missing workers it says
// which and what they last did, and it carries out the worker-loss policy
// on the workers lost past the liveness timeout: dropping them, or failing
// the job through a callback. Time comes from the injected clock only, and
// the caller decides when to look (Tick), so tests drive it on a FakeClock
// without sleeping; the daemon ticks it once a second.

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "server/job_progress.h"
#include "server/worker_loss/worker_loss_policy.h"

namespace ps::server {

struct JobSupervisorOptions {
  // While an iteration waits for missing workers, report them once it has
  // waited this long, and this often.
  absl::Duration stall_report_every = absl::Seconds(5);
  // A worker unheard from for this long is lost (the grace period).
  absl::Duration liveness_timeout = absl::Seconds(10);
  // What to do about a lost worker. Must outlive the supervisor.
  const WorkerLossPolicy* policy = nullptr;
  const Clock* clock = Clock::Real();
  std::function<void(const std::string& line)> log = [](const std::string&) {};
};

// What the supervisor reads and acts on. Called on the ticking thread.
struct SupervisedJob {
  std::function<JobProgress()> progress;
  // Takes `rank` out of the job (ParameterServerService::DropWorker).
  std::function<absl::Status(int rank)> drop;
  // Fails the job: called once, with the failure naming the rank and why.
  std::function<void(const absl::Status& failure)> fail;
};

class JobSupervisor {
 public:
  JobSupervisor(JobSupervisorOptions options, SupervisedJob job);

  // One look at the job at the clock's time: the stall report when due,
  // then the policy's action for each lost rank. Returns false once the job
  // has failed (later ticks do nothing). Not thread-safe: one ticking
  // thread.
  bool Tick();

  bool failed() const { return failed_; }

 private:
  const JobSupervisorOptions options_;
  const SupervisedJob job_;
  int64_t last_report_ns_ = -1;
  bool failed_ = false;
};

}  // namespace ps::server

#endif  // PS_SERVER_JOB_SUPERVISOR_H_
