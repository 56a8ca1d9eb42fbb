#ifndef PS_SERVER_WORKER_LOSS_WORKER_LOSS_POLICY_H_
#define PS_SERVER_WORKER_LOSS_WORKER_LOSS_POLICY_H_

// What the server does about a lost worker (--on_worker_loss): one
// interface, one file per policy (wait.cc, shrink.cc), one parser of their
// names. The job supervisor (server/job_supervisor.h) finds the lost
// ranks and carries out what the policy decides. Immutable; thread-safe.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/consistency/consistency.h"
#include "server/job_progress.h"

namespace ps::server {

class WorkerLossPolicy {
 public:
  virtual ~WorkerLossPolicy() = default;

  // "wait" or "shrink", as --on_worker_loss spells it.
  virtual std::string Name() const = 0;

  // Whether the job's membership may change (the registration reply says
  // so, and workers then read each iteration's members).
  virtual bool Shrinks() const = 0;

  // OK when the policy is defined under `consistency`; kInvalidArgument
  // saying why not.
  virtual absl::Status CheckConsistency(const Consistency& consistency) const;

  // What to do about worker `w` of rank `rank`, found lost (unheard from
  // for the liveness timeout, which is the grace period) while iteration
  // `version` waits for it, at `now_ns` on the supervisor's clock.
  enum class Action {
    kKeepWaiting,  // nothing now
    kDrop,         // take the rank out of the job and go on without it
    kFailJob,      // the job cannot go on: fail it (Failure says why)
  };
  virtual Action OnLost(int rank, const WorkerProgress& w, int64_t version,
                        int64_t now_ns) const = 0;

  // The job's failure, for kFailJob: names the rank, how long it was lost
  // and the setting that ran out.
  virtual absl::Status Failure(int rank, const WorkerProgress& w,
                               int64_t version, int64_t now_ns) const;
};

// wait: a lost worker keeps its rank and the job waits for it to come back
// (it rejoins at the current step: bit-identical), failing the job once it
// has been lost for `loss_timeout`.
std::unique_ptr<WorkerLossPolicy> WaitForLostWorkers(absl::Duration loss_timeout);
// shrink: a registered worker lost past the grace period is dropped and the
// job goes on with the others (a worker that never came is waited for).
std::unique_ptr<WorkerLossPolicy> ShrinkOnWorkerLoss();

// "wait" or "shrink"; kInvalidArgument naming the choices for anything else.
absl::StatusOr<std::unique_ptr<WorkerLossPolicy>> ParseWorkerLossPolicy(
    absl::string_view name, absl::Duration loss_timeout);

}  // namespace ps::server

#endif  // PS_SERVER_WORKER_LOSS_WORKER_LOSS_POLICY_H_
