#include "server/rank_order_sum.h"

#include <utility>

#include "absl/strings/string_view.h"

namespace ps::server {

void RankOrderSum::Reset(int64_t length, int num_workers) {
  values_.assign(length, 0.f);
  ranks_summed_ = 0;
  started_ = false;
  held_.assign(num_workers, std::vector<float>());
}

int64_t RankOrderSum::Add(int rank, F32Pieces part, const std::vector<bool>& waived) {
  const int64_t n = PiecesBytes(part) / static_cast<int64_t>(sizeof(float));
  if (n == 0) return 0;  // an empty tensor: nothing to sum, in any order
  SkipWaived(waived);
  if (ranks_summed_ != rank) {
    // A lower rank's part is still missing: hold this one until its turn.
    held_[rank].resize(n);
    CopyPiecesTo(part, held_[rank].data());
    return n;
  }
  StartOrAdd(part);
  ++ranks_summed_;
  return -DrainHeld(waived);
}

bool RankOrderSum::IsLastTerm(int rank, F32Pieces part, const std::vector<bool>& waived) {
  if (PiecesBytes(part) == 0) return false;
  SkipWaived(waived);
  if (ranks_summed_ != rank) return false;  // a lower rank's part is missing
  for (int r = rank + 1; r < static_cast<int>(waived.size()); ++r) {
    if (!waived[r]) return false;  // a higher rank's part is held for after it
  }
  return true;
}

int64_t RankOrderSum::DropHeld() {
  int64_t freed = 0;
  for (std::vector<float>& held : held_) {
    freed += static_cast<int64_t>(held.size());
    held = std::vector<float>();
  }
  return freed;
}

void RankOrderSum::Restart() {
  ranks_summed_ = 0;
  started_ = false;
}

void RankOrderSum::SkipWaived(const std::vector<bool>& waived) {
  const int num_workers = static_cast<int>(waived.size());
  while (ranks_summed_ < num_workers && waived[ranks_summed_]) ++ranks_summed_;
}

void RankOrderSum::StartOrAdd(F32Pieces part) {
  // The first part (rank 0's, unless it is waived) starts the sum: 0 + g
  // written without reading the old sum, so the sum needs no zeroing
  // between iterations (and -0 starts it as +0, as adding to a zero would).
  if (!started_) {
    AssignPiecesTo(part, values_.data());
    started_ = true;
  } else {
    AddPiecesTo(part, values_.data());
  }
}

int64_t RankOrderSum::DrainHeld(const std::vector<bool>& waived) {
  // Every held part whose turn has come, in rank order, past waived ranks.
  const int num_workers = static_cast<int>(held_.size());
  int64_t freed = 0;
  for (;;) {
    SkipWaived(waived);
    if (ranks_summed_ >= num_workers || held_[ranks_summed_].empty()) return freed;
    std::vector<float> held = std::move(held_[ranks_summed_]);
    held_[ranks_summed_] = std::vector<float>();
    // The held copy as one piece (the first term when the ranks before it
    // are waived).
    const absl::string_view piece(reinterpret_cast<const char*>(held.data()),
                                  held.size() * sizeof(float));
    StartOrAdd(absl::MakeConstSpan(&piece, 1));
    freed += static_cast<int64_t>(held.size());
    ++ranks_summed_;
  }
}

}  // namespace ps::server
