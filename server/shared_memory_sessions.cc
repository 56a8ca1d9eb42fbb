#include "server/shared_memory_sessions.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ps::server {

absl::Status SharedMemorySessions::Attach(int rank, const std::string& session,
                                          const proto::SharedMemory* offer,
                                          int64_t max_data_bytes) {
  std::shared_ptr<SharedMemorySegment> segment;
  absl::Status status;
  if (offer != nullptr) {
    absl::StatusOr<std::unique_ptr<SharedMemorySegment>> attached = SharedMemorySegment::Attach(
        offer->pid(), offer->fd(), offer->data_bytes(), offer->nonce(), max_data_bytes);
    if (attached.ok()) {
      segment = *std::move(attached);
    } else {
      status = attached.status();
    }
  }
  // A registration replaces the rank's earlier session, and its memory.
  absl::MutexLock lock(&mu_);
  auto old = session_of_rank_.find(rank);
  if (old != session_of_rank_.end()) {
    segments_.erase(old->second);
    session_of_rank_.erase(old);
  }
  if (segment != nullptr) {
    segments_[session] = std::move(segment);
    session_of_rank_[rank] = session;
  }
  return status;
}

void SharedMemorySessions::Register(const proto::RegisterRequest& request, int rank,
                                    const std::string& session, int64_t max_data_bytes,
                                    proto::RegisterReply* reply) {
  const proto::SharedMemory* offer =
      request.has_shared_memory() ? &request.shared_memory() : nullptr;
  const absl::Status attached = Attach(rank, session, offer, max_data_bytes);
  if (offer == nullptr) return;
  reply->set_shared_memory_attached(attached.ok());
  if (!attached.ok()) reply->set_shared_memory_error(std::string(attached.message()));
}

std::shared_ptr<SharedMemorySegment> SharedMemorySessions::SegmentOf(
    const std::string& session) const {
  if (session.empty()) return nullptr;
  absl::MutexLock lock(&mu_);
  auto it = segments_.find(session);
  return it == segments_.end() ? nullptr : it->second;
}

absl::StatusOr<int64_t> SharedMemoryChunkElements(const SharedMemorySegment* segment,
                                                  const proto::TensorChunk& chunk, bool push,
                                                  absl::string_view what) {
  if (!push || chunk.dtype() != proto::DTYPE_F32 || chunk.encoding() != proto::ENCODING_DENSE) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " of key ", chunk.key(), " chunk ", chunk.chunk(),
                     " is in shared memory; only pushes of dense F32 chunks may be"));
  }
  if (segment == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " of key ", chunk.key(), " chunk ", chunk.chunk(),
                     " is in shared memory, but this session has none attached"));
  }
  if (!segment->Contains(chunk.shm_offset(), chunk.data_bytes()) ||
      chunk.data_bytes() % sizeof(float) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " of key ", chunk.key(), " chunk ", chunk.chunk(), ": bytes [", chunk.shm_offset(),
        ", +", chunk.data_bytes(), ") are not whole F32 elements inside the shared memory's ",
        segment->data_bytes()));
  }
  return chunk.data_bytes() / static_cast<int64_t>(sizeof(float));
}

void CopyFromSharedMemory(const SharedMemorySegment& segment, const proto::TensorChunk& chunk,
                          absl::Span<float> out) {
  std::memcpy(out.data(), segment.data() + chunk.shm_offset(),
              static_cast<size_t>(chunk.data_bytes()));
}

absl::Status CheckPullIntoSharedMemory(const SharedMemorySegment* segment,
                                       const proto::PullRequest& pull) {
  if (segment == nullptr) {
    return absl::InvalidArgumentError(
        "pull into shared memory, but this session has none attached");
  }
  if (pull.dtype() != proto::DTYPE_F32 || pull.delta()) {
    return absl::InvalidArgumentError(
        "a pull into shared memory must be dense F32 (no dtype, no delta)");
  }
  if (pull.shm_offsets_size() != pull.chunks_size()) {
    return absl::InvalidArgumentError(absl::StrCat("pull into shared memory gives ",
                                                   pull.shm_offsets_size(), " offsets for ",
                                                   pull.chunks_size(), " chunks"));
  }
  return absl::OkStatus();
}

absl::Status CheckPullTarget(const SharedMemorySegment& segment, const proto::ChunkId& id,
                             int64_t offset, int64_t elements) {
  if (!segment.Contains(offset, elements * static_cast<int64_t>(sizeof(float)))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pull of chunk ", id.chunk(), " of key ", id.key(), " into shared memory at byte ", offset,
        ": its ", elements * sizeof(float), " bytes do not fit in ", segment.data_bytes()));
  }
  return absl::OkStatus();
}

void WriteToSharedMemory(absl::Span<const float> values, int64_t offset,
                         const SharedMemorySegment& segment, proto::TensorChunk* chunk) {
  const int64_t bytes = static_cast<int64_t>(values.size() * sizeof(float));
  std::memcpy(segment.data() + offset, values.data(), static_cast<size_t>(bytes));
  chunk->set_dtype(proto::DTYPE_F32);
  chunk->set_data_bytes(bytes);
  chunk->set_in_shared_memory(true);
  chunk->set_shm_offset(offset);
}

}  // namespace ps::server
