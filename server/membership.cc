#include "server/membership.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ps::server {

Membership::Membership(int num_workers)
    : participating_(num_workers, true), dropped_(num_workers, false) {
  for (int r = 0; r < num_workers; ++r) members_.push_back(r);
}

absl::StatusOr<std::vector<int>> Membership::MembersOf(int64_t iteration, int64_t version,
                                                       int64_t window) const {
  if (iteration == version) return members_;
  if (window > 1 && iteration > version && iteration <= version + window) return members_;
  if (iteration == version + 1 && next_announced_) return next_members_;
  if (iteration < version) {
    return absl::OutOfRangeError(absl::StrCat("iteration ", iteration, " is past (the server is at ",
                                              version, ")"));
  }
  return absl::UnavailableError(absl::StrCat("the members of iteration ", iteration,
                                             " are not announced yet (the server is at ", version,
                                             ")"));
}

void Membership::FreezeNext() {
  next_members_.clear();
  for (int r = 0; r < static_cast<int>(dropped_.size()); ++r) {
    if (!dropped_[r]) next_members_.push_back(r);
  }
  next_announced_ = true;
}

absl::StatusOr<bool> Membership::Drop(int rank) {
  if (dropped_[rank]) return false;
  int others = 0;
  for (int r = 0; r < static_cast<int>(dropped_.size()); ++r) others += r != rank && !dropped_[r];
  if (others == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank, " is the job's last member: the job waits for it"));
  }
  dropped_[rank] = true;
  waivers_dirty_ = true;
  const bool took_part = participating_[rank];
  participating_[rank] = false;
  return took_part;
}

absl::StatusOr<int64_t> Membership::Join(int rank, int64_t version) {
  if (!dropped_[rank]) return version;
  if (next_announced_ &&
      std::find(next_members_.begin(), next_members_.end(), rank) == next_members_.end()) {
    return absl::UnavailableError(absl::StrCat(
        "rank ", rank, " rejoins at a step boundary, and iteration ", version + 1,
        "'s members are announced already: try again in a moment"));
  }
  dropped_[rank] = false;
  FreezeNext();
  return version + 1;
}

absl::Status Membership::CheckTakesPart(int rank, int64_t iteration) const {
  if (participating_[rank]) return absl::OkStatus();
  return absl::AbortedError(absl::StrCat(
      "worker rank ", rank, " takes no part in iteration ", iteration,
      ": it was dropped from the job (lost past the grace period); register again to rejoin "
      "at a step boundary"));
}

bool Membership::AdvanceIteration() {
  AnnounceNext();
  members_ = next_members_;
  next_announced_ = false;
  std::vector<bool> participating(dropped_.size(), false);
  for (int r : members_) participating[r] = !dropped_[r];
  const bool changed = participating != participating_ || waivers_dirty_;
  participating_ = std::move(participating);
  waivers_dirty_ = false;
  return changed;
}

}  // namespace ps::server
