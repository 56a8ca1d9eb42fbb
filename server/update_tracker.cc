#include "server/update_tracker.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ps::server {

void UpdateTracker::LayOut(int64_t total_chunks, int64_t window) {
  chunk_version_.assign(total_chunks, version_);
  applying_.assign(total_chunks, false);
  iterations_.assign(window, Iteration());
  for (Iteration& it : iterations_) it.ready.assign(total_chunks, false);
}

void UpdateTracker::SetVersion(int64_t version) {
  version_ = version;
  std::fill(chunk_version_.begin(), chunk_version_.end(), version);
}

bool UpdateTracker::Has(int64_t version, const ChunkLayout* layout,
                        absl::Span<const ChunkId> chunks) const {
  if (!initialized_) return false;
  if (chunks.empty()) return version_ >= version;
  for (const ChunkId& chunk : chunks) {
    const int64_t gc = layout == nullptr ? -1 : layout->GlobalChunk(chunk.key, chunk.chunk);
    if (gc >= 0 && chunk_version_[gc] < version) return false;
  }
  return true;
}

absl::Status UpdateTracker::Missing(int64_t version, const ChunkLayout* layout,
                                    absl::Span<const ChunkId> chunks) const {
  if (!initialized_) {
    return absl::DeadlineExceededError(absl::StrCat(
        "version ", version, " not reached before the deadline: the initial parameters are ",
        layout == nullptr ? "not known (no worker has registered)"
                          : "incomplete (rank 0 has not sent them all)"));
  }
  if (chunks.empty()) {
    if (version_ >= version) return absl::OkStatus();
    return absl::DeadlineExceededError(absl::StrCat(
        "version ", version, " not reached before the deadline; the server is at version ",
        version_));
  }
  for (const ChunkId& chunk : chunks) {
    const int64_t gc = layout->GlobalChunk(chunk.key, chunk.chunk);
    if (gc >= 0 && chunk_version_[gc] < version) {
      return absl::DeadlineExceededError(absl::StrCat(
          "version ", version, " of chunk ", chunk.chunk, " of '",
          layout->signature[chunk.key].name,
          "' not reached before the deadline; the chunk is at version ", chunk_version_[gc],
          ", the server at version ", version_));
    }
  }
  return absl::OkStatus();
}

int64_t UpdateTracker::ReachableVersion() const {
  int64_t limit = version_ + 1;
  for (size_t gc = 0; gc < chunk_version_.size(); ++gc) {
    limit = std::max(limit, chunk_version_[gc] + (applying_[gc] ? 1 : 0));
  }
  return limit;
}

void UpdateTracker::StartApplying(int64_t iteration, int64_t gc) {
  Slot(iteration).ready[gc] = false;
  applying_[gc] = true;
}

bool UpdateTracker::Publish(int64_t iteration, int64_t gc, bool skipped_this, int64_t now_ns,
                            bool* skipped) {
  applying_[gc] = false;
  chunk_version_[gc] = iteration + 1;
  Iteration& it = Slot(iteration);
  it.skipped |= skipped_this;
  if (++it.applied < static_cast<int64_t>(chunk_version_.size())) return false;
  *skipped = it.skipped;
  it.skipped = false;
  it.applied = 0;
  it.complete = 0;
  version_ = iteration + 1;
  version_ns_ = now_ns;
  return true;
}

void UpdateTracker::PublishAsync(int64_t gc, int64_t version, int64_t now_ns) {
  chunk_version_[gc] = version;
  // The least chunk version moves only when a chunk at it moves (so the
  // scan is not per update).
  if (version - 1 != version_) return;
  const int64_t least = *std::min_element(chunk_version_.begin(), chunk_version_.end());
  if (least != version_) {
    version_ = least;
    version_ns_ = now_ns;
  }
}

}  // namespace ps::server
