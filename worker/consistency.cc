#include "worker/consistency.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace ps::worker {

absl::StatusOr<WorkerConsistency> WorkerConsistency::FromName(absl::string_view name) {
  if (name.empty() || name == "sync") return WorkerConsistency();
  if (name == "async") return WorkerConsistency(Kind::kAsync, 0);
  if (absl::StartsWith(name, "ssp:")) {
    int64_t bound = -1;
    if (!absl::SimpleAtoi(name.substr(4), &bound) || bound < 0) {
      return absl::InternalError(absl::StrCat("a malformed consistency '", name, "'"));
    }
    return WorkerConsistency(Kind::kSsp, bound);
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "consistency '", name, "', which this worker does not know (sync, async, ssp:S)"));
}

std::string WorkerConsistency::Name() const {
  switch (kind_) {
    case Kind::kAsync:
      return "async";
    case Kind::kSsp:
      return absl::StrCat("ssp:", staleness_bound_);
    case Kind::kSync:
      break;
  }
  return "sync";
}

int64_t WorkerConsistency::OldestPullable(int64_t version) const {
  if (kind_ == Kind::kAsync) return 0;
  return std::max<int64_t>(0, version - staleness_bound_);
}

}  // namespace ps::worker
