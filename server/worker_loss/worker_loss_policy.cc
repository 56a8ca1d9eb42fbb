#include "server/worker_loss/worker_loss_policy.h"

#include "absl/strings/str_cat.h"

namespace ps::server {

absl::Status WorkerLossPolicy::CheckConsistency(const Consistency& /*consistency*/) const {
  return absl::OkStatus();
}

absl::Status WorkerLossPolicy::Failure(int rank, const WorkerProgress& w,
                                       int64_t version, int64_t /*now_ns*/) const {
  return absl::FailedPreconditionError(absl::StrCat("job failed: worker rank ", rank, " ('", w.id,
                                                    "') lost at iteration ", version,
                                                    " (--on_worker_loss=", Name(), ")"));
}

absl::StatusOr<std::unique_ptr<WorkerLossPolicy>> ParseWorkerLossPolicy(
    absl::string_view name, absl::Duration loss_timeout) {
  if (name == "wait") return WaitForLostWorkers(loss_timeout);
  if (name == "shrink") return ShrinkOnWorkerLoss();
  return absl::InvalidArgumentError(
      absl::StrCat("--on_worker_loss=", name, ": use wait or shrink"));
}

}  // namespace ps::server
