#ifndef PS_SERVER_CHUNK_TABLE_H_
#define PS_SERVER_CHUNK_TABLE_H_

// The model's chunks on the server, each under a lock of its own: its
// parameters (ChunkBuffers: current and previous, copy on write), its
// version (the updates applied to it) and, per iteration in flight, the
// rank-order sum of the workers' parts (RankOrderSum). The table does to a
// chunk what it is told; which iteration a chunk applies, and when, is
// ParameterServer's to decide (it claims an update before calling Apply,
// so no two threads update one chunk at once).
//
// Thread-safe. Every method takes the lock of the chunk it touches, one at
// a time, and an update takes the optimizer device's lock under it (a
// CpuDevice of several threads runs one ParallelFor at a time); no other
// lock is taken, so a caller may hold its own lock around any call.

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/cpu_device.h"
#include "common/f32_pieces.h"
#include "common/optimizer/optimizer.h"
#include "server/initial_values.h"
#include "server/parameter_table.h"
#include "server/rank_order_sum.h"

namespace ps::server {

class ChunkTable {
 public:
  // Lays `signature` out in chunks of `chunk_elements` (ChunkLayout::Make:
  // kInvalidArgument for what cannot be laid out, models of max_parameters
  // elements or more) with `initial`'s values matched by name (LayOut in
  // initial_values.h; kFailedPrecondition for a missing tensor or another
  // shape), or zeros when it is empty. kResourceExhausted, with the sizes,
  // for a model whose parameters, momentum and `window` sums cannot fit in
  // this machine's memory, before anything is allocated.
  static absl::StatusOr<std::unique_ptr<ChunkTable>> Create(
      const std::vector<ParamSpec>& signature, int64_t chunk_elements, int64_t max_parameters,
      const std::vector<NamedTensor>& initial, int num_workers, int64_t window,
      CpuDevice* device);
  // `layout`'s chunks, with the values of `initial` (flat, in layout order)
  // or zeros when it is empty, at version 0, each with `window` iteration
  // slots (iteration k in slot k % window) summing `num_workers` ranks.
  // `device` runs the optimizer's kernels and must outlive the table.
  ChunkTable(ChunkLayout layout, int num_workers, int64_t window,
             const std::vector<float>& initial, CpuDevice* device);

  const ChunkLayout& layout() const { return layout_; }
  // The tensor name of global chunk `gc`, for messages and events.
  const std::string& name(int64_t gc) const;
  // Gradient elements held for their rank's turn in the sums, all chunks.
  int64_t held_elements() const { return held_elements_.load(); }

  // Summing. Adds worker `rank`'s part of chunk `gc` in iteration
  // `iteration` over `num_samples` samples. `overflow`: the part is not
  // finite (dynamic loss scaling): the chunk's update of the iteration is
  // skipped, and nothing more of it is summed.
  struct Added {
    // Every member's part is in (a waived rank counting as in).
    bool completes = false;
    // `part` was not added: it is the sum's last term
    // (RankOrderSum::IsLastTerm), for Apply to read in place, or for
    // AddLastTerm when the update cannot run now.
    bool last_term_pending = false;
  };
  Added Add(int64_t gc, int64_t iteration, int rank, F32Pieces part, int64_t num_samples,
            bool overflow);
  void AddLastTerm(int64_t gc, int64_t iteration, int rank, F32Pieces part);
  // Takes `rank`'s part of chunk `gc` in iteration `iteration` as pushed
  // (the rank was dropped), if the chunk is at that iteration and has not
  // waived it yet; returns whether that completes the chunk.
  bool Waive(int64_t gc, int64_t iteration, int rank);
  // Waive of each of `gcs`; returns those it completed, in order.
  std::vector<int64_t> WaiveEach(absl::Span<const int64_t> gcs, int64_t iteration, int rank);
  // From now on every chunk waives the ranks not `participating` (at a
  // version boundary, before any part of the new iteration is added).
  void WaiveAbsent(const std::vector<bool>& participating);

  // The update of chunk `gc` (at version `iteration`) by the iteration's
  // sum, plus `last_term` when given (the sum's last term, not added),
  // which resets the slot and moves the chunk to version iteration + 1.
  // `loss_scale` is the iteration's (0: none). Returns whether the update
  // was skipped (an overflow: the parameters stay, held parts are dropped).
  // The previous parameters are kept for exact pulls. An iteration of no
  // samples keeps the parameters, or, under an optimizer that publishes
  // the mean gradient (Optimizer::Output), publishes zeros.
  absl::StatusOr<bool> Apply(int64_t gc, int64_t iteration, float loss_scale,
                             const F32Pieces* last_term, Optimizer& optimizer);
  // An asynchronous update of chunk `gc` by one worker's `gradient` over
  // `num_samples` samples (0: nothing changes), computed from version
  // `based_on_version`; the schedule counts the chunk's updates divided by
  // `num_workers`. Returns the chunk's new version and the push's
  // staleness (the chunk's updates since based_on_version).
  struct Applied {
    int64_t version = 0;
    int64_t staleness = 0;
  };
  absl::StatusOr<Applied> ApplyNow(int64_t gc, int64_t based_on_version, int64_t num_samples,
                                   int num_workers, F32Pieces gradient,
                                   Optimizer& optimizer);

  // Writes chunk `gc`'s initial values (its length, checked by the caller).
  void Initialize(int64_t gc, F32Pieces values);
  // Every chunk at `version` (a server resumed from a checkpoint).
  void SetVersion(int64_t version);

  // Chunk `gc`'s parameters now (at the returned version, or, with
  // `exact`, at `version` exactly; kFailedPrecondition when the chunk is
  // past it and its previous parameters are not those), held by the
  // returned pointers: an update of the chunk meanwhile writes a copy.
  // `previous` (with `with_previous`, when the chunk is at `version`): its
  // parameters of version - 1, or null.
  struct View {
    int64_t version = 0;
    std::shared_ptr<const std::vector<float>> params;
    std::shared_ptr<const std::vector<float>> previous;
  };
  absl::StatusOr<View> Take(int64_t gc, int64_t version, bool exact, bool with_previous) const;
  // Take of each of `gcs`, in order, as spans that stay valid and unchanged
  // while `keep_alive` (or a copy) lives, which holds exactly these chunks'
  // buffers (an update of any other chunk writes in place); `version` is
  // the least of theirs (`version` as given for none), `bytes` their size.
  // `previous` (with `with_previous`) has an entry per chunk, empty where
  // Take gave none.
  struct Views {
    int64_t version = 0;
    std::shared_ptr<const void> keep_alive;
    std::vector<absl::Span<const float>> chunks;
    std::vector<absl::Span<const float>> previous;
    int64_t bytes = 0;
  };
  absl::StatusOr<Views> TakeAll(absl::Span<const int64_t> gcs, int64_t version, bool exact,
                                bool with_previous) const;
  // Copies every chunk's current parameters into `out` (num_parameters).
  void CopyAll(absl::Span<float> out) const;

 private:
  // One iteration's aggregation of one chunk: the rank-order sum, how many
  // workers pushed it (counted apart from the sum, which an empty tensor's
  // chunk never advances) and the samples their pushes cover.
  struct Aggregation {
    RankOrderSum sum;
    int pushes = 0;
    int64_t samples = 0;
    bool overflow = false;  // a push was not finite: the update is skipped
  };
  struct Chunk {
    mutable absl::Mutex mu;
    ChunkBuffers buffers ABSL_GUARDED_BY(mu);
    int64_t version ABSL_GUARDED_BY(mu) = 0;
    // Iteration k's in slots[k % window_]; an asynchronous update uses
    // slots[0].sum's buffer as its scratch.
    std::vector<Aggregation> slots ABSL_GUARDED_BY(mu);
    // Ranks whose part the iteration in progress does without (dropped):
    // skipped in the rank order and counted as pushed.
    std::vector<bool> waived ABSL_GUARDED_BY(mu);
    int waived_count ABSL_GUARDED_BY(mu) = 0;
  };

  Aggregation& SlotLocked(Chunk& chunk, int64_t iteration) ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu) {
    return chunk.slots[iteration % window_];
  }
  void SumLocked(int rank, Chunk& chunk, Aggregation& agg, F32Pieces part)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);

  const ChunkLayout layout_;
  const int num_workers_;
  const int64_t window_;
  CpuDevice* const device_;
  // Serialises the optimizer's kernels on a device of several threads; on
  // one thread each kernel runs on its caller and chunks update at once.
  absl::Mutex device_mu_;
  std::unique_ptr<Chunk[]> chunks_;  // layout_.total_chunks of them
  std::atomic<int64_t> held_elements_{0};
};

}  // namespace ps::server

#endif  // PS_SERVER_CHUNK_TABLE_H_
