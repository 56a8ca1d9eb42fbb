// wait: the job waits for a lost worker to come back at its rank, up to a
// timeout, then fails. Nothing about the sum changes, so a worker that
// returns in time leaves the run bit-identical to one that never left.

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "server/worker_loss/worker_loss_policy.h"

namespace ps::server {
namespace {

class WaitForLostWorkersImpl final : public WorkerLossPolicy {
 public:
  explicit WaitForLostWorkersImpl(absl::Duration loss_timeout) : loss_timeout_(loss_timeout) {}

  std::string Name() const override { return "wait"; }
  bool Shrinks() const override { return false; }

  Action OnLost(int /*rank*/, const WorkerProgress& w, int64_t /*version*/,
                int64_t now_ns) const override {
    // A rank nobody has registered yet, or one never heard from, is not
    // lost but late: the job waits for it as at its start.
    if (w.id.empty() || w.heard_ns < 0) return Action::kKeepWaiting;
    return now_ns - w.heard_ns < absl::ToInt64Nanoseconds(loss_timeout_) ? Action::kKeepWaiting
                                                                         : Action::kFailJob;
  }

  absl::Status Failure(int rank, const WorkerProgress& w, int64_t version,
                       int64_t now_ns) const override {
    return absl::FailedPreconditionError(absl::StrCat(
        "job failed: worker rank ", rank, " ('", w.id, "') lost for ",
        absl::FormatDuration(
            absl::Trunc(absl::Nanoseconds(now_ns - w.heard_ns), absl::Milliseconds(100))),
        " at iteration ", version, " (--on_worker_loss=wait, --worker_loss_timeout=",
        absl::FormatDuration(loss_timeout_), ")"));
  }

 private:
  const absl::Duration loss_timeout_;
};

}  // namespace

std::unique_ptr<WorkerLossPolicy> WaitForLostWorkers(absl::Duration loss_timeout) {
  return std::make_unique<WaitForLostWorkersImpl>(loss_timeout);
}

}  // namespace ps::server
