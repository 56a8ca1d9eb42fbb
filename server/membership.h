#ifndef PS_SERVER_MEMBERSHIP_H_
#define PS_SERVER_MEMBERSHIP_H_

// Which ranks take part in each synchronous iteration, as the job shrinks
// (--on_worker_loss=shrink drops a lost rank) and grows back (a dropped
// rank registers again). The members of iteration `version` are fixed; the
// next iteration's are announced ("frozen") once a member has pushed part
// of the current one (or a dropped rank rejoined), and from then on do not
// change: a worker computes its share of the global batch from them.
//
// Not thread-safe: ParameterServer calls it under its bookkeeping lock.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ps::server {

class Membership {
 public:
  // Every rank of `num_workers` a member.
  explicit Membership(int num_workers);

  // The ranks taking part in iteration `iteration`, ascending, the server
  // being at `version` with `window` iterations in flight (ssp:S: S + 1,
  // where nobody is dropped, so every iteration in flight and the one after
  // have the same members). kUnavailable for an iteration not announced
  // yet, kOutOfRange for a past one.
  absl::StatusOr<std::vector<int>> MembersOf(int64_t iteration, int64_t version,
                                             int64_t window) const;
  // Announces the next iteration's members (the ranks not dropped), unless
  // they are announced already.
  void AnnounceNext() {
    if (!next_announced_) FreezeNext();
  }
  bool next_announced() const { return next_announced_; }

  // Takes `rank` out of the job: it is in no iteration announced from now
  // on, and the current one does without its missing parts. Returns whether
  // it took part in the current iteration (then its chunks not pushed must
  // be waived); false when it was dropped already. kFailedPrecondition for
  // the last member (the job waits for it).
  absl::StatusOr<bool> Drop(int rank);

  // A rank registering, the server at `version`: the iteration it joins at.
  // `version` unless the rank was dropped; then it is back in at the first
  // iteration whose members are not announced yet (version + 1, announced
  // at once), or kUnavailable when version + 1's are announced without it.
  absl::StatusOr<int64_t> Join(int rank, int64_t version);
  // The members of the iteration a rank joined at (Join's answer).
  const std::vector<int>& MembersAt(int64_t joins_at, int64_t version) const {
    return joins_at == version ? members_ : next_members_;
  }

  // At a version boundary: the next iteration's members (announced now if
  // they were not) become the current ones. Returns whether the chunks'
  // waivers must be set anew from participating(): the set changed, or a
  // Drop waived parts mid-iteration.
  bool AdvanceIteration();
  // Per rank: a member of the current iteration, not dropped.
  const std::vector<bool>& participating() const { return participating_; }
  // Whether `rank` sits out: dropped, or no member of the current iteration.
  bool sits_out(int rank) const { return dropped_[rank] || !participating_[rank]; }
  // kAborted, saying how to rejoin, when `rank` takes no part in the
  // current iteration `iteration`.
  absl::Status CheckTakesPart(int rank, int64_t iteration) const;

 private:
  void FreezeNext();

  std::vector<int> members_;
  std::vector<int> next_members_;
  bool next_announced_ = false;
  std::vector<bool> participating_;
  std::vector<bool> dropped_;
  bool waivers_dirty_ = false;  // a Drop set some mid-iteration
};

}  // namespace ps::server

#endif  // PS_SERVER_MEMBERSHIP_H_
