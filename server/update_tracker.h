#ifndef PS_SERVER_UPDATE_TRACKER_H_
#define PS_SERVER_UPDATE_TRACKER_H_

// Where the updates stand, and what they have published. Per chunk: its
// published version and whether a thread is applying an update of it; per
// iteration in flight: which chunks are ready (every member's part summed,
// the update not yet taken up), how many are complete and how many
// published, and whether an update was skipped; for the server: whether
// version 0 exists, its version (every chunk's) and when it was published.
// Pulls wait on these (Has) and name what they miss (Missing). Not
// thread-safe: ParameterServer keeps it under its bookkeeping lock.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "server/parameter_table.h"

namespace ps::server {

class UpdateTracker {
 public:
  explicit UpdateTracker(int64_t now_ns) : version_ns_(now_ns) {}
  // `total_chunks` chunks at version 0, `window` iterations in flight
  // (iteration k in slot k % window).
  void LayOut(int64_t total_chunks, int64_t window);

  // Published state.
  bool initialized() const { return initialized_; }
  void SetInitialized() { initialized_ = true; }
  int64_t version() const { return version_; }
  int64_t version_ns() const { return version_ns_; }  // when version() was published
  int64_t chunk_version(int64_t gc) const { return chunk_version_[gc]; }
  // The server and every chunk at `version` (resumed from a checkpoint).
  void SetVersion(int64_t version);
  // Whether a pull of `chunks` at `version` may answer: version 0 exists
  // and every chunk of `chunks` that `layout` has (null: none) is at
  // `version`; an empty request needs the server's version.
  bool Has(int64_t version, const ChunkLayout* layout, absl::Span<const ChunkId> chunks) const;
  // The kDeadlineExceeded of such a pull that timed out, naming what is
  // missing: version 0, the server's version, or a chunk's (OK when
  // nothing is).
  absl::Status Missing(int64_t version, const ChunkLayout* layout,
                       absl::Span<const ChunkId> chunks) const;
  // The least version no chunk can pass while nothing new is claimed: a
  // chunk is at its published version, or one past it while applied.
  int64_t ReachableVersion() const;

  // Updates of iterations. `count` chunks of `iteration` have every
  // member's part, counted before any of their updates starts.
  void AddComplete(int64_t iteration, int64_t count) { Slot(iteration).complete += count; }
  int64_t complete(int64_t iteration) const { return Slot(iteration).complete; }
  // Chunk `gc`'s update of `iteration` is ready to be applied.
  void MarkReady(int64_t iteration, int64_t gc) { Slot(iteration).ready[gc] = true; }
  bool ready(int64_t iteration, int64_t gc) const { return Slot(iteration).ready[gc]; }
  bool applying(int64_t gc) const { return applying_[gc]; }
  // A thread takes up chunk `gc`'s update of `iteration` (one at a time).
  void StartApplying(int64_t iteration, int64_t gc);
  // The update failed (an optimizer invariant): the chunk is free again.
  void StopApplying(int64_t gc) { applying_[gc] = false; }
  // The update is written: chunk `gc` publishes iteration + 1. When it was
  // the iteration's last chunk, the server's version moves to
  // iteration + 1 at `now_ns`, the slot is reset, and it returns true with
  // *skipped saying whether any of the iteration's updates was skipped.
  bool Publish(int64_t iteration, int64_t gc, bool skipped_this, int64_t now_ns, bool* skipped);
  // An asynchronous update published: chunk `gc` at `version`; the
  // server's version is the least chunk version.
  void PublishAsync(int64_t gc, int64_t version, int64_t now_ns);

 private:
  struct Iteration {
    std::vector<bool> ready;
    int64_t complete = 0;
    int64_t applied = 0;
    bool skipped = false;
  };
  Iteration& Slot(int64_t iteration) { return iterations_[iteration % iterations_.size()]; }
  const Iteration& Slot(int64_t iteration) const {
    return iterations_[iteration % iterations_.size()];
  }

  bool initialized_ = false;
  int64_t version_ = 0;
  int64_t version_ns_ = -1;
  std::vector<int64_t> chunk_version_;
  std::vector<bool> applying_;
  std::vector<Iteration> iterations_;
};

}  // namespace ps::server

#endif  // PS_SERVER_UPDATE_TRACKER_H_
