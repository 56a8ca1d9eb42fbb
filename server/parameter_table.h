#ifndef PS_SERVER_PARAMETER_TABLE_H_
#define PS_SERVER_PARAMETER_TABLE_H_

// How the server holds the model: laid out flat in signature order and cut
// into chunks (ChunkLayout), each chunk's parameters in buffers of their own
// shared with the views pulls take (ChunkBuffers, copy on write).

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/param_spec.h"

namespace ps::server {

// A chunk by its key and its index among the key's chunks.
struct ChunkId {
  int key = 0;
  int64_t chunk = 0;
};

// The model laid out flat in signature order and cut into chunks: per key,
// chunk_elements each (the last one shorter; an empty tensor is one empty
// chunk, see ChunkCount). Immutable once made.
struct ChunkLayout {
  std::vector<ParamSpec> signature;
  int64_t chunk_elements = 0;
  std::vector<int64_t> key_offset;       // element offset of each key
  std::vector<int64_t> key_first_chunk;  // global index of each key's chunk 0
  int64_t total_chunks = 0;
  int64_t num_parameters = 0;
  // Per global chunk: its key, element offset in the flat layout, length.
  std::vector<int> chunk_key;
  std::vector<int64_t> chunk_offset;
  std::vector<int64_t> chunk_length;

  // Lays `signature` out. The shapes come from the wire: kInvalidArgument
  // for an empty signature, a parameter that is not F32, a negative
  // dimension, or a tensor or model of `max_parameters` elements or more
  // (checked before anything is allocated, so sizes derived from the
  // layout cannot overflow). chunk_elements >= 1.
  static absl::StatusOr<ChunkLayout> Make(const std::vector<ParamSpec>& signature,
                                          int64_t chunk_elements, int64_t max_parameters);

  // Global index of chunk `chunk` of key `key`, or -1 when either is out
  // of range (cheap: no message is built, so wait conditions may call it).
  int64_t GlobalChunk(int key, int64_t chunk) const;
  // The same check with its error: kOutOfRange naming the key or the chunk.
  absl::StatusOr<int64_t> FindChunk(int key, int64_t chunk) const;
  // The key and index of global chunk `gc` (in range).
  ChunkId IdOf(int64_t gc) const {
    return {chunk_key[gc], gc - key_first_chunk[chunk_key[gc]]};
  }
};

// One chunk's parameters and, after an update, the ones before it (what a
// worker that pulled the previous version holds: exact pulls and delta
// pulls read them). The buffers are shared with the views handed out
// (shared_ptr copies): a view stays valid and unchanged while held, and a
// write to a buffer still viewed goes to a fresh copy instead (copy on
// write), so holding views costs up to one copy per update held across.
// Not thread-safe: the server guards it with the chunk's lock, and takes
// views only under that lock, so a use count of one (the buffers' own)
// cannot grow during a write.
class ChunkBuffers {
 public:
  ChunkBuffers() = default;
  explicit ChunkBuffers(std::vector<float> initial)
      : current_(std::make_shared<std::vector<float>>(std::move(initial))) {}

  // The parameters now, and before the last update (null before the first).
  const std::shared_ptr<std::vector<float>>& current() const { return current_; }
  const std::shared_ptr<std::vector<float>>& previous() const { return previous_; }

  // The current parameters to write in place (initial values): a fresh copy
  // first when a view still holds them.
  std::vector<float>& MutableCurrent();

  // An update, out of place: NextBuffer() is the buffer to write (every
  // element of it; its contents are undefined), reusing the previous
  // parameters' storage unless a view still holds it; Publish(next) makes
  // it current and the current parameters previous. A failed update drops
  // `next` and leaves current() as it was (previous() may be gone).
  std::shared_ptr<std::vector<float>> NextBuffer();
  void Publish(std::shared_ptr<std::vector<float>> next);
  // An update that changed nothing (skipped, or no samples): the previous
  // parameters are the current ones.
  void PublishUnchanged() { previous_ = current_; }

 private:
  std::shared_ptr<std::vector<float>> current_;
  std::shared_ptr<std::vector<float>> previous_;
};

}  // namespace ps::server

#endif  // PS_SERVER_PARAMETER_TABLE_H_
