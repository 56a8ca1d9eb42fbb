#ifndef PS_WORKER_CONSISTENCY_H_
#define PS_WORKER_CONSISTENCY_H_

// The worker's side of the server's consistency policy
// (server/consistency/consistency.h): what a registration reply's
// consistency name means for the steps a worker runs and the pulls it
// makes. The only worker code that knows the names; stores and the trainer
// ask it questions. A plain value: copyable, comparable, thread-safe.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ps::worker {

class WorkerConsistency {
 public:
  // sync: what a store without a server (or an older server) runs.
  WorkerConsistency() = default;

  // From RegisterReply.consistency: "sync" (or empty, from an older
  // server), "async" or "ssp:S". kFailedPrecondition for a name this
  // worker does not know (a newer server), kInternal for a malformed
  // "ssp:" bound; both quote the name.
  static absl::StatusOr<WorkerConsistency> FromName(absl::string_view name);

  // "sync", "async" or "ssp:S".
  std::string Name() const;

  // async: every push is applied as it arrives and pulls bring the newest
  // parameters, whatever version they ask for; the worker runs its own
  // steps from 0, waiting for nobody.
  bool independent_steps() const { return kind_ == Kind::kAsync; }

  // ssp:S's S, the updates a step's parameters may lag behind; 0 otherwise.
  int64_t staleness_bound() const { return staleness_bound_; }

  // ssp:S with S > 0: a pull for version v takes the newest parameters of
  // version v - S or later, waiting only while v - S does not exist, and a
  // worker that ran ahead catches up at the end of an epoch.
  bool stale_pulls() const { return kind_ == Kind::kSsp && staleness_bound_ > 0; }

  // A pull for version v returns exactly version v (the server holds it
  // until it exists): sync and ssp:0.
  bool exact_pulls() const { return kind_ != Kind::kAsync && !stale_pulls(); }

  // The oldest version a pull for version `version` accepts.
  int64_t OldestPullable(int64_t version) const;

  // The server answers each push with its staleness, and the store keeps
  // the version each message's parameters came from (async and ssp:S).
  bool reports_staleness() const { return kind_ != Kind::kSync; }

  // Top-k's delta pulls (only the elements that changed since the version
  // this worker holds) assume every pull steps one version: sync only.
  bool allows_delta_pulls() const { return kind_ == Kind::kSync; }

  bool operator==(const WorkerConsistency& other) const {
    return kind_ == other.kind_ && staleness_bound_ == other.staleness_bound_;
  }
  bool operator!=(const WorkerConsistency& other) const { return !(*this == other); }

 private:
  enum class Kind { kSync, kAsync, kSsp };
  WorkerConsistency(Kind kind, int64_t staleness_bound)
      : kind_(kind), staleness_bound_(staleness_bound) {}

  Kind kind_ = Kind::kSync;
  int64_t staleness_bound_ = 0;
};

}  // namespace ps::worker

#endif  // PS_WORKER_CONSISTENCY_H_
