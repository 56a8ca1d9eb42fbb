#ifndef PS_SERVER_CHUNK_MESSAGE_H_
#define PS_SERVER_CHUNK_MESSAGE_H_

// A message's chunks as the server receives them (a push, or initial
// values), and the checks they need before anything is added: each chunk
// exists and has its length, none comes twice, and every value is finite.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "server/parameter_table.h"

namespace ps::server {

// A chunk (`chunk` of key `key`) whose F32 elements lie, little-endian, in
// consecutive byte ranges (a received message's slices read in place;
// common/f32_pieces.h): any alignment, an element may straddle two pieces.
struct ChunkBytes {
  int key = 0;
  int64_t chunk = 0;
  absl::Span<const absl::string_view> pieces;
};

// Checks every chunk of a message without reading its values: it exists
// (kOutOfRange naming the key or chunk), has 4 x its length in bytes
// (kInvalidArgument), and is neither in `received` (by global index; empty:
// none, as when every push is an update of its own) nor
// repeated within the message (kAlreadyExists, "already `what`"). Appends
// each chunk's global index to `global_chunks`, stopping at the first that
// fails, whose error it returns.
absl::Status CheckChunkShapes(const ChunkLayout& layout, absl::Span<const ChunkBytes> chunks,
                              const std::vector<bool>& received, absl::string_view what,
                              std::vector<int64_t>* global_chunks);

// Checks the values of the first `count` chunks (their shapes checked):
// kInvalidArgument naming the first non-finite one, or, given `overflow`
// (dynamic loss scaling; one entry per chunk), that chunk marked there
// instead.
absl::Status CheckChunkValues(const ChunkLayout& layout, absl::Span<const ChunkBytes> chunks,
                              size_t count, std::vector<bool>* overflow = nullptr);

// The kAlreadyExists of `chunk`: "chunk C of 'name' already `what`".
absl::Status AlreadyReceivedError(const ChunkLayout& layout, const ChunkBytes& chunk,
                                  absl::string_view what);

}  // namespace ps::server

#endif  // PS_SERVER_CHUNK_MESSAGE_H_
