#include "server/f32_pieces.h"

#include <algorithm>
#include <cmath>

namespace ps::server {

using internal::LoadF32;

int64_t PiecesBytes(F32Pieces pieces) {
  int64_t bytes = 0;
  for (absl::string_view piece : pieces) bytes += static_cast<int64_t>(piece.size());
  return bytes;
}

int64_t FirstNonFinite(F32Pieces pieces, float* value) {
  int64_t found = -1;
  internal::ForEachRun(pieces, [&](int64_t first, const char* bytes, int64_t count) {
    if (found >= 0) return;
    // One vectorisable pass decides; only a bad run pays for finding where.
    bool all_finite = true;
    for (int64_t i = 0; i < count; ++i) all_finite &= std::isfinite(LoadF32(bytes + 4 * i));
    if (all_finite) return;
    int64_t i = 0;
    while (std::isfinite(LoadF32(bytes + 4 * i))) ++i;
    found = first + i;
    *value = LoadF32(bytes + 4 * i);
  });
  return found;
}

void AddPiecesTo(F32Pieces pieces, float* sum) {
  internal::ForEachRun(pieces, [sum](int64_t first, const char* bytes, int64_t count) {
    float* out = sum + first;
    for (int64_t i = 0; i < count; ++i) out[i] += LoadF32(bytes + 4 * i);
  });
}

void CopyPiecesTo(F32Pieces pieces, float* out) {
  char* dst = reinterpret_cast<char*>(out);
  for (absl::string_view piece : pieces) {
    std::memcpy(dst, piece.data(), piece.size());
    dst += piece.size();
  }
}

}  // namespace ps::server
