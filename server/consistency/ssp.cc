// ssp:S, stale synchronous parallel (Ho et al. 2013, Bosen): a worker may
// begin step t once every worker has pushed step t - S - 1, i.e. once
// version t - S exists, and computes it from whatever newer parameters it
// pulls (version t - S or later, chunks possibly of different versions).
// The updates are those of sync: iteration k's update of a chunk is the
// rank-order sum of every worker's push of iteration k, applied once all
// have arrived and iteration k - 1's update of that chunk is applied, with
// the learning rate of step k; only what the workers computed their
// gradients from differs from sync, so ssp:0 is sync bit for bit.
//
// The server enforces the bound (CheckNotAhead): a push for iteration t is
// accepted only while version() >= t - S, so iterations version() ..
// version() + S are in flight at once (Window() = S + 1), each with its own
// sums, held parts and per-worker bookkeeping (S + 1 gradient sums of a
// model each in memory); a push beyond is refused with kOutOfRange naming
// the bound. A worker's pull for step t asks for version t - S and waits
// for it. A rejoined worker resumes at version() and what its previous
// process pushed of every iteration in flight is counted once, but under
// S > 0 it computes from the newest parameters, so only S = 0 stays
// bit-identical. State captures wait for a boundary with no chunk ahead of
// version(). Shrinking is not supported under S > 0 (CheckCanShrink).

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
