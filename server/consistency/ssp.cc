// ssp:S, stale synchronous parallel (Ho et al. 2013): the iterations of
// sync, applied in order, but up to S + 1 of them in flight at once, so a
// worker may compute step t once every rank has pushed step t - S - 1.
// ssp:0 is sync bit for bit (only its name differs).

#include <algorithm>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "server/consistency/consistency.h"

namespace ps::server {
namespace {

class SspConsistencyImpl final : public Consistency {
 public:
  explicit SspConsistencyImpl(int64_t staleness) : staleness_(staleness) {}

  std::string Name() const override { return absl::StrCat("ssp:", staleness_); }
  int64_t Window() const override { return staleness_ + 1; }

  absl::Status CheckNotAhead(int64_t iteration, int64_t version) const override {
    if (iteration < version + Window()) return absl::OkStatus();
    return absl::OutOfRangeError(absl::StrCat(
        "push for iteration ", iteration, " runs ahead of the ", Name(),
        " bound: it may be computed once every rank has pushed iteration ",
        iteration - Window(), " (version ", iteration - Window() + 1,
        "), and the server is at version ", version));
  }

  std::optional<int64_t> ReplyStaleness(int64_t iteration,
                                        int64_t based_on_version) const override {
    return std::max<int64_t>(0, iteration - based_on_version);
  }

  absl::Status CheckCanShrink() const override {
    if (staleness_ == 0) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "shrinking changes an iteration's members, and under ", Name(),
        " several iterations are in flight at once; use --on_worker_loss=wait (a lost worker "
        "rejoins), or sync / ssp:0"));
  }

 private:
  const int64_t staleness_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<const Consistency>> SspConsistency(int64_t staleness) {
  if (staleness < 0 || staleness > kMaxStaleness) {
    return absl::InvalidArgumentError(absl::StrCat("ssp staleness must be 0 to ", kMaxStaleness,
                                                   ", got ", staleness));
  }
  return std::shared_ptr<const Consistency>(std::make_shared<SspConsistencyImpl>(staleness));
}

}  // namespace ps::server
