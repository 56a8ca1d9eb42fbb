#ifndef PS_SERVER_SHARED_MEMORY_SESSIONS_H_
#define PS_SERVER_SHARED_MEMORY_SESSIONS_H_

// Shared memory as a transport beside TCP (common/shared_memory.h says why):
// a worker on the server's host offers a segment when it registers
// (RegisterRequest.shared_memory); its pushes then name byte ranges of it
// instead of carrying data, and its pulls name where each chunk goes. This
// file holds the server's side: the segments by session, and the checks and
// copies of both directions, so the gRPC service asks "which segment does
// this call's session have" and hands chunks to these functions.
//
// The worker may write its memory at any time: a pushed chunk is copied out
// (one memcpy) before anything checks or sums it, and a pulled chunk is
// copied in (one memcpy) from the parameters viewed.

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/shared_memory.h"
#include "proto/parameter_server.pb.h"

namespace ps::server {

// The segments workers offered, each bound to the session of the
// registration that offered it: a call of another session cannot name it.
// Thread-safe; a call in flight keeps its segment mapped through the
// shared_ptr SegmentOf returned, whatever Attach does meanwhile.
class SharedMemorySessions {
 public:
  // A registration of `rank` as `session`: replaces the rank's earlier
  // session and its segment, and maps and binds the segment `offer`
  // announces (none when null), at most `max_data_bytes` of data. Returns
  // OK when mapped (or nothing was offered), else why not (the errors of
  // SharedMemorySegment::Attach), and then the session has none.
  absl::Status Attach(int rank, const std::string& session, const proto::SharedMemory* offer,
                      int64_t max_data_bytes);
  // Attach for a registration: its offer (RegisterRequest.shared_memory,
  // if any), and whether it was mapped, or why not, said in `reply`.
  void Register(const proto::RegisterRequest& request, int rank, const std::string& session,
                int64_t max_data_bytes, proto::RegisterReply* reply);
  // The segment bound to `session`, or null ("" has none).
  std::shared_ptr<SharedMemorySegment> SegmentOf(const std::string& session) const;

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<SharedMemorySegment>> segments_
      ABSL_GUARDED_BY(mu_);
  std::map<int, std::string> session_of_rank_ ABSL_GUARDED_BY(mu_);
};

// Receiving: the F32 elements a chunk marked in_shared_memory holds, once
// checked: only pushes (`push`; initial values never) of dense F32 chunks
// may be, the call's session must have a `segment`, and the chunk's bytes
// [shm_offset, +data_bytes) must be whole F32 elements inside it.
// kInvalidArgument naming `what`, the key, the chunk and the problem.
absl::StatusOr<int64_t> SharedMemoryChunkElements(const SharedMemorySegment* segment,
                                                  const proto::TensorChunk& chunk, bool push,
                                                  absl::string_view what);
// Copies such a chunk (checked) out of `segment` into `out`, its elements.
void CopyFromSharedMemory(const SharedMemorySegment& segment, const proto::TensorChunk& chunk,
                          absl::Span<float> out);

// Sending: the checks of a pull into shared memory (pull.shared_memory)
// before its chunks are sized: the session has a `segment`, the pull is
// dense F32 (no dtype, no delta), and it gives one offset per chunk.
// kInvalidArgument naming the problem.
absl::Status CheckPullIntoSharedMemory(const SharedMemorySegment* segment,
                                       const proto::PullRequest& pull);
// Whether chunk `id`, of `elements` F32 elements, fits at byte `offset` of
// `segment`; kInvalidArgument naming the chunk, the offset and the sizes.
absl::Status CheckPullTarget(const SharedMemorySegment& segment, const proto::ChunkId& id,
                             int64_t offset, int64_t elements);
// Copies `values` to byte `offset` of `segment` (checked by
// CheckPullTarget) and describes them in the reply's `chunk`: F32, their
// bytes, in shared memory at `offset`.
void WriteToSharedMemory(absl::Span<const float> values, int64_t offset,
                         const SharedMemorySegment& segment, proto::TensorChunk* chunk);

}  // namespace ps::server

#endif  // PS_SERVER_SHARED_MEMORY_SESSIONS_H_
