#ifndef PS_SERVER_RANK_ORDER_SUM_H_
#define PS_SERVER_RANK_ORDER_SUM_H_

// The deterministic sum of one chunk's gradients over the workers of one
// iteration: ((0 + g_0) + g_1) + ... in rank order, whatever order the
// parts arrive in, so a rerun (or a recovery) gives bit-identical
// parameters. A part that arrives before a lower rank's is copied and held
// until its turn: no extra memory when parts arrive in rank order, at most
// (num_workers - 1) parts when they arrive in reverse.
//
// Ranks the iteration does without (dropped from the job; `waived`, one
// flag per rank) are skipped in the order. Not thread-safe: the server
// guards each chunk's sums with that chunk's lock.

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "common/f32_pieces.h"

namespace ps::server {

class RankOrderSum {
 public:
  // An empty sum of `length` elements over `num_workers` ranks. Allocates
  // the sum's buffer (length floats); held parts are allocated as needed.
  void Reset(int64_t length, int num_workers);

  // Adds worker `rank`'s part (`length` elements; any alignment, see
  // common/f32_pieces.h) if every lower rank's part is summed or waived,
  // then every held part whose turn has come; otherwise holds a copy of it
  // for its turn. An empty part (an empty tensor's chunk) adds nothing.
  // Returns how many elements this call added to (+) or took from (-) the
  // held parts, for the server's held_elements() count.
  int64_t Add(int rank, F32Pieces part, const std::vector<bool>& waived);

  // Whether `part`, worker `rank`'s, would be the sum's last term: every
  // lower rank's part is summed (or waived) and every higher rank is
  // waived. The caller may then add it inside the update, read in place,
  // instead of calling Add: the same sum bit for bit (see
  // Optimizer::ApplyRangeAdding). False for an empty part.
  bool IsLastTerm(int rank, F32Pieces part, const std::vector<bool>& waived);

  // After a rank was waived mid-iteration (its part will never come): adds
  // the held parts whose turn has come now. Returns the elements freed.
  int64_t SumHeldInTurn(const std::vector<bool>& waived) { return DrainHeld(waived); }

  // Whether any part started the sum (a sum of only waived or empty parts
  // has not: it is zero).
  bool started() const { return started_; }
  // The sum so far (length elements; meaningful once started()).
  absl::Span<const float> values() const { return values_; }
  // The sum's buffer as scratch: an asynchronous server writes each push
  // into it before its update. Leaves the sum meaningless until Restart.
  std::vector<float>& mutable_values() { return values_; }

  // Frees the held parts (an iteration whose update is skipped); returns
  // how many elements they held.
  int64_t DropHeld();
  // Ready for the next iteration: nothing summed (the buffer is kept and
  // overwritten by the next first term, so it needs no zeroing). Held parts
  // must have been drained or dropped.
  void Restart();

 private:
  // Moves past waived ranks.
  void SkipWaived(const std::vector<bool>& waived);
  // 0 + part for the first term, sum + part for the others.
  void StartOrAdd(F32Pieces part);
  // Adds the held parts whose turn has come; returns the elements freed.
  int64_t DrainHeld(const std::vector<bool>& waived);

  std::vector<float> values_;
  int ranks_summed_ = 0;  // ranks 0 .. ranks_summed_ - 1 are summed or waived
  bool started_ = false;
  std::vector<std::vector<float>> held_;  // [rank]: its early part, or empty
};

}  // namespace ps::server

#endif  // PS_SERVER_RANK_ORDER_SUM_H_
