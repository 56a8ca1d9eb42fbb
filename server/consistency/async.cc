// async: every push is applied as it arrives, scaled by its own samples,
// each chunk's version advancing per update; workers never wait for each
// other, and a pull of version 0 returns the newest parameters.

#include <memory>
#include <string>

#include "server/consistency/consistency.h"

namespace ps::server {
namespace {

class AsyncConsistencyImpl final : public Consistency {
 public:
  std::string Name() const override { return "async"; }
  bool AppliesEachPush() const override { return true; }
  absl::Status CheckCanShrink() const override {
    return absl::FailedPreconditionError(
        "under async no worker waits for another, so a lost worker holds nobody up and there "
        "is nothing to shrink; use --on_worker_loss=wait");
  }
};

}  // namespace

std::shared_ptr<const Consistency> AsyncConsistency() {
  return std::make_shared<AsyncConsistencyImpl>();
}

}  // namespace ps::server
