// shrink: a worker lost past the grace period (the liveness timeout) is
// dropped, and the job goes on with the others, the global batch split
// over them; a worker that comes back rejoins at a step boundary.

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "server/worker_loss/worker_loss_policy.h"

namespace ps::server {
namespace {

class ShrinkOnWorkerLossImpl final : public WorkerLossPolicy {
 public:
  std::string Name() const override { return "shrink"; }
  bool Shrinks() const override { return true; }

  absl::Status CheckConsistency(const Consistency& consistency) const override {
    if (absl::Status can = consistency.CheckCanShrink(); !can.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--on_worker_loss=shrink with --consistency=", consistency.Name(),
                       " is not supported: ", can.message()));
    }
    return absl::OkStatus();
  }

  Action OnLost(int /*rank*/, const WorkerProgress& w, int64_t /*version*/,
                int64_t /*now_ns*/) const override {
    // A rank that never came is waited for: there is nobody to drop.
    return w.id.empty() ? Action::kKeepWaiting : Action::kDrop;
  }
};

}  // namespace

std::unique_ptr<WorkerLossPolicy> ShrinkOnWorkerLoss() {
  return std::make_unique<ShrinkOnWorkerLossImpl>();
}

}  // namespace ps::server
