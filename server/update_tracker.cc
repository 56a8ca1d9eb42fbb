#include "server/update_tracker.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ps::server {

void UpdateTracker::LayOut(const ChunkLayout* layout, int64_t window) {
  absl::MutexLock lock(&mu_);
  layout_ = layout;
  chunk_version_.assign(layout->total_chunks, version_);
  applying_.assign(layout->total_chunks, false);
  iterations_.assign(window, Iteration());
  for (Iteration& it : iterations_) it.ready.assign(layout->total_chunks, false);
}

bool UpdateTracker::initialized() const {
  absl::MutexLock lock(&mu_);
  return initialized_;
}

void UpdateTracker::SetInitialized() {
  absl::MutexLock lock(&mu_);
  initialized_ = true;
}

int64_t UpdateTracker::version() const {
  absl::MutexLock lock(&mu_);
  return version_;
}

int64_t UpdateTracker::version_ns() const {
  absl::MutexLock lock(&mu_);
  return version_ns_;
}

int64_t UpdateTracker::chunk_version(int64_t gc) const {
  absl::MutexLock lock(&mu_);
  return chunk_version_[gc];
}

void UpdateTracker::SetVersion(int64_t version) {
  absl::MutexLock lock(&mu_);
  version_ = version;
  std::fill(chunk_version_.begin(), chunk_version_.end(), version);
}

int64_t UpdateTracker::ReachableVersion() const {
  absl::MutexLock lock(&mu_);
  int64_t limit = version_ + 1;
  for (size_t gc = 0; gc < chunk_version_.size(); ++gc) {
    limit = std::max(limit, chunk_version_[gc] + (applying_[gc] ? 1 : 0));
  }
  return limit;
}

bool UpdateTracker::HasLocked(int64_t version, absl::Span<const ChunkId> chunks) const {
  if (!initialized_) return false;
  if (chunks.empty()) return version_ >= version;
  for (const ChunkId& chunk : chunks) {
    const int64_t gc = layout_->GlobalChunk(chunk.key, chunk.chunk);
    if (gc >= 0 && chunk_version_[gc] < version) return false;
  }
  return true;
}

bool UpdateTracker::Has(int64_t version, absl::Span<const ChunkId> chunks) const {
  absl::MutexLock lock(&mu_);
  if (layout_ != nullptr) {
    for (const ChunkId& chunk : chunks) {
      if (layout_->GlobalChunk(chunk.key, chunk.chunk) < 0) return true;  // refused at once
    }
  }
  return HasLocked(version, chunks);
}

absl::Status UpdateTracker::MissingLocked(int64_t version,
                                          absl::Span<const ChunkId> chunks) const {
  if (!initialized_) {
    return absl::DeadlineExceededError(absl::StrCat(
        "version ", version, " not reached before the deadline: the initial parameters are ",
        layout_ == nullptr ? "not known (no worker has registered)"
                           : "incomplete (rank 0 has not sent them all)"));
  }
  if (chunks.empty()) {
    return absl::DeadlineExceededError(absl::StrCat(
        "version ", version, " not reached before the deadline; the server is at version ",
        version_));
  }
  for (const ChunkId& chunk : chunks) {
    const int64_t gc = layout_->GlobalChunk(chunk.key, chunk.chunk);
    if (gc >= 0 && chunk_version_[gc] < version) {
      return absl::DeadlineExceededError(absl::StrCat(
          "version ", version, " of chunk ", chunk.chunk, " of '",
          layout_->signature[chunk.key].name,
          "' not reached before the deadline; the chunk is at version ", chunk_version_[gc],
          ", the server at version ", version_));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> UpdateTracker::Await(
    int64_t version, absl::Time deadline, absl::Span<const ChunkId> chunks) const {
  absl::MutexLock lock(&mu_);
  std::vector<int64_t> global_chunks;
  auto find = [this, chunks, &global_chunks]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
    global_chunks.clear();
    for (const ChunkId& chunk : chunks) {
      PS_ASSIGN_OR_RETURN(const int64_t gc, layout_->FindChunk(chunk.key, chunk.chunk));
      global_chunks.push_back(gc);
    }
    return absl::OkStatus();
  };
  if (layout_ != nullptr) PS_RETURN_IF_ERROR(find());
  auto ready = [this, version, chunks]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return HasLocked(version, chunks);
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&ready), deadline)) {
    PS_RETURN_IF_ERROR(MissingLocked(version, chunks));
  }
  PS_RETURN_IF_ERROR(find());  // the signature may have come during the wait
  return global_chunks;
}

void UpdateTracker::AddComplete(int64_t iteration, int64_t count) {
  absl::MutexLock lock(&mu_);
  Slot(iteration).complete += count;
}

int64_t UpdateTracker::complete(int64_t iteration) const {
  absl::MutexLock lock(&mu_);
  return Slot(iteration).complete;
}

void UpdateTracker::MarkReady(int64_t iteration, int64_t gc) {
  absl::MutexLock lock(&mu_);
  Slot(iteration).ready[gc] = true;
}

bool UpdateTracker::ready(int64_t iteration, int64_t gc) const {
  absl::MutexLock lock(&mu_);
  return Slot(iteration).ready[gc];
}

bool UpdateTracker::applying(int64_t gc) const {
  absl::MutexLock lock(&mu_);
  return applying_[gc];
}

void UpdateTracker::StartApplying(int64_t iteration, int64_t gc) {
  absl::MutexLock lock(&mu_);
  Slot(iteration).ready[gc] = false;
  applying_[gc] = true;
}

void UpdateTracker::StopApplying(int64_t gc) {
  absl::MutexLock lock(&mu_);
  applying_[gc] = false;
}

bool UpdateTracker::Publish(int64_t iteration, int64_t gc, bool skipped_this, int64_t now_ns,
                            bool* skipped) {
  absl::MutexLock lock(&mu_);
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
  absl::MutexLock lock(&mu_);
  // Two pushes of one chunk update it in turn under the chunk's lock but
  // publish here after releasing it, so the later version may arrive
  // first: a chunk's published version never goes back.
  if (version <= chunk_version_[gc]) return;
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
