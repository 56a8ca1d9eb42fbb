// sync: bulk synchronous SGD. Every member pushes every iteration, the
// server sums the pushes in rank order and applies one update: bit for bit
// one device's SGD on the global batch (the project's core promise).

#include <memory>
#include <string>

#include "server/consistency/consistency.h"

namespace ps::server {
namespace {

class SyncConsistencyImpl final : public Consistency {
 public:
  std::string Name() const override { return "sync"; }
  absl::Status CheckCanShrink() const override { return absl::OkStatus(); }
  bool SupportsLossScaling() const override { return true; }
  bool PacesPushes() const override { return true; }
};

}  // namespace

std::shared_ptr<const Consistency> SyncConsistency() {
  return std::make_shared<SyncConsistencyImpl>();
}

}  // namespace ps::server
