#include "server/f32_pieces.h"

#include <algorithm>
#include <cmath>

namespace ps::server {

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
  // ForEachRun's walk, keeping each straddling element's value.
  std::vector<F32Run> runs;
  char carry[sizeof(float)];
  size_t carry_len = 0;
  int64_t element = 0;
  for (absl::string_view piece : pieces) {
    const char* bytes = piece.data();
    size_t size = piece.size();
    if (carry_len > 0) {
      const size_t take = std::min(sizeof(float) - carry_len, size);
      std::memcpy(carry + carry_len, bytes, take);
      carry_len += take;
      bytes += take;
      size -= take;
      if (carry_len < sizeof(float)) continue;
      runs.push_back({element++, 1, nullptr, LoadF32(carry)});
      carry_len = 0;
    }
    const int64_t whole = static_cast<int64_t>(size / sizeof(float));
    for (int64_t done = 0; done < whole; done += max_count) {
      runs.push_back({element + done, std::min(max_count, whole - done),
                      bytes + done * static_cast<int64_t>(sizeof(float))});
    }
    element += whole;
    carry_len = size % sizeof(float);
    std::memcpy(carry, bytes + whole * sizeof(float), carry_len);
  }
  return runs;
}

}  // namespace ps::server
