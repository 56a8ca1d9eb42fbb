#ifndef PS_COMMON_F32_PIECES_H_
#define PS_COMMON_F32_PIECES_H_

// F32 elements stored little-endian across consecutive byte ranges, read in
// place: a received gRPC message is a list of slices (HTTP/2 frames cut out
// of socket reads), so a chunk's bytes arrive in pieces of any length at any
// alignment, and one element may straddle two pieces. These helpers check,
// sum and copy such elements without gathering the pieces first; only a
// straddling element is assembled (in 4 bytes on the stack). Transport-free:
// the pieces are plain byte ranges the caller keeps alive.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace ps {

using F32Pieces = absl::Span<const absl::string_view>;

// Total bytes of `pieces`.
int64_t PiecesBytes(F32Pieces pieces);

// Index of the first non-finite element (its value in `*value`), or -1 when
// all are finite. The pieces must hold a whole number of elements.
int64_t FirstNonFinite(F32Pieces pieces, float* value);

// sum[i] += element i, for every element of `pieces` (a whole number of
// them; `sum` holds at least that many).
void AddPiecesTo(F32Pieces pieces, float* sum);

// out[i] = 0 + element i: the first term of a sum, bit for bit what adding
// to a zeroed `out` gives (-0 becomes +0), without reading `out`.
void AssignPiecesTo(F32Pieces pieces, float* out);

// Copies the elements of `pieces` (a whole number of them) to `out`.
void CopyPiecesTo(F32Pieces pieces, float* out);

// Elements [first, first + count) of some pieces: `count` little-endian
// floats at `bytes` (any alignment, inside a piece), or, where bytes is
// null, the one element that straddles two pieces, assembled in
// `straddled`.
struct F32Run {
  int64_t first = 0;
  int64_t count = 0;
  const char* bytes = nullptr;
  float straddled = 0.f;

  const void* data() const {
    return bytes != nullptr ? static_cast<const void*>(bytes) : &straddled;
  }
};

// The runs of `pieces` (a whole number of elements) in order, none longer
// than `max_count` elements (a longer one is cut): work to hand out over
// threads without gathering the pieces first.
std::vector<F32Run> F32Runs(F32Pieces pieces, int64_t max_count);

namespace internal {

inline float LoadF32(const char* bytes) {
  float value;
  std::memcpy(&value, bytes, sizeof(value));
  return value;
}

// Calls run(first_element, bytes, count) for consecutive runs of whole
// elements: `count` unaligned little-endian floats at `bytes`, element
// `first_element` onwards, inside one piece; and straddled(element, bytes)
// for an element that straddles two pieces, assembled in 4 bytes on this
// function's stack (valid during the call).
template <typename Run, typename Straddled>
void ForEachRun(F32Pieces pieces, Run run, Straddled straddled) {
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
      straddled(element, static_cast<const char*>(carry));
      ++element;
      carry_len = 0;
    }
    const int64_t whole = static_cast<int64_t>(size / sizeof(float));
    if (whole > 0) run(element, bytes, whole);
    element += whole;
    carry_len = size % sizeof(float);
    std::memcpy(carry, bytes + whole * sizeof(float), carry_len);
  }
}

// The same with a straddling element coming to `run` as a run of one.
template <typename Run>
void ForEachRun(F32Pieces pieces, Run run) {
  ForEachRun(pieces, run,
             [&run](int64_t element, const char* bytes) { run(element, bytes, int64_t{1}); });
}

}  // namespace internal
}  // namespace ps

#endif  // PS_COMMON_F32_PIECES_H_
