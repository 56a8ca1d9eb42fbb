#include "server/chunk_message.h"

#include "absl/strings/str_cat.h"
#include "common/f32_pieces.h"
#include "common/push_checks.h"
#include "common/status_macros.h"

namespace ps::server {

absl::Status AlreadyReceivedError(const ChunkLayout& layout, const ChunkBytes& chunk,
                                  absl::string_view what) {
  return absl::AlreadyExistsError(absl::StrCat(
      "chunk ", chunk.chunk, " of '", layout.signature[chunk.key].name, "' already ", what));
}

absl::Status CheckChunkShapes(const ChunkLayout& layout, absl::Span<const ChunkBytes> chunks,
                              const std::vector<bool>& received, absl::string_view what,
                              std::vector<int64_t>* global_chunks) {
  for (const ChunkBytes& chunk : chunks) {
    PS_ASSIGN_OR_RETURN(const int64_t global_chunk, layout.FindChunk(chunk.key, chunk.chunk));
    const int64_t length = layout.chunk_length[global_chunk];
    const int64_t bytes = PiecesBytes(chunk.pieces);
    if (bytes != length * static_cast<int64_t>(sizeof(float))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk ", chunk.chunk, " of '", layout.signature[chunk.key].name, "' needs ", length,
          " elements, got ",
          bytes % sizeof(float) == 0 ? absl::StrCat(bytes / sizeof(float))
                                     : absl::StrCat(bytes, " bytes")));
    }
    bool repeated = !received.empty() && received[global_chunk];
    for (const int64_t earlier : *global_chunks) repeated |= earlier == global_chunk;
    if (repeated) return AlreadyReceivedError(layout, chunk, what);
    global_chunks->push_back(global_chunk);
  }
  return absl::OkStatus();
}

absl::Status CheckChunkValues(const ChunkLayout& layout, absl::Span<const ChunkBytes> chunks,
                              size_t count, std::vector<bool>* overflow) {
  for (size_t c = 0; c < count; ++c) {
    PS_ASSIGN_OR_RETURN(
        const bool overflowed,
        CheckGradientValues(chunks[c].pieces, chunks[c].chunk * layout.chunk_elements,
                            layout.signature[chunks[c].key].name,
                            /*loss_scaling=*/overflow != nullptr));
    if (overflowed) (*overflow)[c] = true;
  }
  return absl::OkStatus();
}

}  // namespace ps::server
