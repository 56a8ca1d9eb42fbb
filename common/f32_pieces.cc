#include "common/f32_pieces.h"

#include <algorithm>
#include <cmath>

namespace ps {

using internal::LoadF32;

namespace {
// An F32 is finite unless its exponent bits are all ones.
constexpr uint32_t kExponent = 0x7f800000u;
}  // namespace

int64_t PiecesBytes(F32Pieces pieces) {
  int64_t bytes = 0;
  for (absl::string_view piece : pieces) bytes += static_cast<int64_t>(piece.size());
  return bytes;
}

int64_t FirstNonFinite(F32Pieces pieces, float* value) {
  int64_t found = -1;
  internal::ForEachRun(pieces, [&](int64_t first, const char* bytes, int64_t count) {
    if (found >= 0) return;
    // One vectorised pass decides (integer tests of the exponent: GCC 12
    // vectorises them over these unaligned loads, while its isfinite loop
    // stayed scalar); only a bad run pays for finding where.
    uint32_t all_ones = 0;
    for (int64_t i = 0; i < count; ++i) {
      uint32_t b;
      std::memcpy(&b, bytes + 4 * i, sizeof(b));
      all_ones |= (b & kExponent) == kExponent;
    }
    if (all_ones == 0) return;
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

void AssignPiecesTo(F32Pieces pieces, float* out) {
  internal::ForEachRun(pieces, [out](int64_t first, const char* bytes, int64_t count) {
    float* o = out + first;
    for (int64_t i = 0; i < count; ++i) o[i] = LoadF32(bytes + 4 * i) + 0.f;
  });
}

void CopyPiecesTo(F32Pieces pieces, float* out) {
  char* dst = reinterpret_cast<char*>(out);
  for (absl::string_view piece : pieces) {
    std::memcpy(dst, piece.data(), piece.size());
    dst += piece.size();
  }
}

std::vector<F32Run> F32Runs(F32Pieces pieces, int64_t max_count) {
  std::vector<F32Run> runs;
  internal::ForEachRun(
      pieces,
      [&](int64_t first, const char* bytes, int64_t count) {
        for (int64_t done = 0; done < count; done += max_count) {
          runs.push_back({first + done, std::min(max_count, count - done),
                          bytes + done * static_cast<int64_t>(sizeof(float))});
        }
      },
      // Assembled on ForEachRun's stack: keep its value.
      [&](int64_t element, const char* bytes) {
        runs.push_back({element, 1, nullptr, LoadF32(bytes)});
      });
  return runs;
}

}  // namespace ps
