#ifndef PS_SERVER_UPDATE_TRACKER_H_
#define PS_SERVER_UPDATE_TRACKER_H_

// Where the updates stand, and what they have published. Per chunk: its
// published version and whether a thread is applying an update of it; per
// iteration in flight: which chunks are ready (every member's part summed,
// the update not yet taken up), how many are complete and how many
// published, and whether an update was skipped; for the server: whether
// version 0 exists, its version (every chunk's) and when it was published.
// Pulls wait here for what they need (Await).
//
// Thread-safe, with a lock of its own: ParameterServer changes it under its
// bookkeeping lock (taking this one inside, never the reverse), and pulls
// wait on this one alone, so a waiting pull never holds up a push.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "server/parameter_table.h"

namespace ps::server {

class UpdateTracker {
 public:
  explicit UpdateTracker(int64_t now_ns) : version_ns_(now_ns) {}
  // `layout`'s chunks (it outlives the tracker) at the current version,
  // `window` iterations in flight (iteration k in slot k % window). Once.
  void LayOut(const ChunkLayout* layout, int64_t window);

  // Published state.
  bool initialized() const;
  void SetInitialized();
  int64_t version() const;
  int64_t version_ns() const;  // when version() was published
  int64_t chunk_version(int64_t gc) const;
  // The server and every chunk at `version` (resumed from a checkpoint).
  void SetVersion(int64_t version);
  // The least version no chunk can pass while nothing new is claimed: a
  // chunk is at its published version, or one past it while applied.
  int64_t ReachableVersion() const;

  // Pulls. Whether a pull of `chunks` at `version` would answer at once:
  // version 0 exists and every chunk is at `version` (an empty request:
  // the server is), or a chunk does not exist (refused at once).
  bool Has(int64_t version, absl::Span<const ChunkId> chunks) const;
  // Waits until that holds and returns each chunk's global index, in
  // request order. kOutOfRange for a chunk that does not exist, at once
  // (before any signature: after the wait for version 0);
  // kDeadlineExceeded once `deadline` passes, naming what is missing
  // (version 0, the server's version, or a chunk's).
  absl::StatusOr<std::vector<int64_t>> Await(int64_t version, absl::Time deadline,
                                             absl::Span<const ChunkId> chunks) const;

  // Updates of iterations. `count` chunks of `iteration` have every
  // member's part, counted before any of their updates starts.
  void AddComplete(int64_t iteration, int64_t count);
  int64_t complete(int64_t iteration) const;
  // Chunk `gc`'s update of `iteration` is ready to be applied.
  void MarkReady(int64_t iteration, int64_t gc);
  bool ready(int64_t iteration, int64_t gc) const;
  bool applying(int64_t gc) const;
  // A thread takes up chunk `gc`'s update of `iteration` (one at a time).
  void StartApplying(int64_t iteration, int64_t gc);
  // The update failed (an optimizer invariant): the chunk is free again.
  void StopApplying(int64_t gc);
  // The update is written: chunk `gc` publishes iteration + 1. When it was
  // the iteration's last chunk, the server's version moves to
  // iteration + 1 at `now_ns`, the slot is reset, and it returns true with
  // *skipped saying whether any of the iteration's updates was skipped.
  bool Publish(int64_t iteration, int64_t gc, bool skipped_this, int64_t now_ns, bool* skipped);
  // An asynchronous update published: chunk `gc` at `version` (unless it
  // published a later one already: concurrent updates of one chunk may
  // publish out of order); the server's version is the least chunk version.
  void PublishAsync(int64_t gc, int64_t version, int64_t now_ns);

 private:
  struct Iteration {
    std::vector<bool> ready;
    int64_t complete = 0;
    int64_t applied = 0;
    bool skipped = false;
  };
  Iteration& Slot(int64_t iteration) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return iterations_[iteration % iterations_.size()];
  }
  const Iteration& Slot(int64_t iteration) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return iterations_[iteration % iterations_.size()];
  }
  bool HasLocked(int64_t version, absl::Span<const ChunkId> chunks) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status MissingLocked(int64_t version, absl::Span<const ChunkId> chunks) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  const ChunkLayout* layout_ ABSL_GUARDED_BY(mu_) = nullptr;  // null until LayOut
  bool initialized_ ABSL_GUARDED_BY(mu_) = false;
  int64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t version_ns_ ABSL_GUARDED_BY(mu_) = -1;
  std::vector<int64_t> chunk_version_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> applying_ ABSL_GUARDED_BY(mu_);
  std::vector<Iteration> iterations_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps::server

#endif  // PS_SERVER_UPDATE_TRACKER_H_
