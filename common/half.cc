#include "common/half.h"

#include <cassert>
#include <cstddef>

namespace ps {

void HalfToFloat(absl::Span<const uint16_t> in, absl::Span<float> out) {
  assert(in.size() == out.size());
  for (size_t i = 0; i < in.size(); ++i) out[i] = HalfToFloat(in[i]);
}

void FloatToHalf(absl::Span<const float> in, absl::Span<uint16_t> out) {
  assert(in.size() == out.size());
  for (size_t i = 0; i < in.size(); ++i) out[i] = FloatToHalf(in[i]);
}

void Bfloat16ToFloat(absl::Span<const uint16_t> in, absl::Span<float> out) {
  assert(in.size() == out.size());
  for (size_t i = 0; i < in.size(); ++i) out[i] = Bfloat16ToFloat(in[i]);
}

void FloatToBfloat16(absl::Span<const float> in, absl::Span<uint16_t> out) {
  assert(in.size() == out.size());
  for (size_t i = 0; i < in.size(); ++i) out[i] = FloatToBfloat16(in[i]);
}

}  // namespace ps
