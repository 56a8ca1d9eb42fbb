#ifndef PS_COMMON_HALF_H_
#define PS_COMMON_HALF_H_

// 16-bit floats held as their bit patterns (uint16_t), converted to and from
// float on the host: IEEE 754 binary16 ("half", PyTorch's float16,
// safetensors' F16) and bfloat16 (float's top 16 bits, safetensors' BF16).
//
// Float -> 16 bits rounds to nearest, ties to even (as the hardware
// converters and PyTorch do): magnitudes beyond the largest finite value
// become infinity, tiny ones become half subnormals or a signed zero. NaN
// stays NaN (quiet, sign kept). 16 bits -> float is exact.
//
// Pure functions: thread-safe, no state. The span versions require
// in.size() == out.size() and convert element by element.

#include <cstdint>
#include <cstring>

#include "absl/types/span.h"

namespace ps {

float HalfToFloat(uint16_t half);
uint16_t FloatToHalf(float value);

float Bfloat16ToFloat(uint16_t bf16);
uint16_t FloatToBfloat16(float value);

void HalfToFloat(absl::Span<const uint16_t> in, absl::Span<float> out);
void FloatToHalf(absl::Span<const float> in, absl::Span<uint16_t> out);
void Bfloat16ToFloat(absl::Span<const uint16_t> in, absl::Span<float> out);
void FloatToBfloat16(absl::Span<const float> in, absl::Span<uint16_t> out);

// ---------------------------------------------------------------------------
// Implementation: inline so loops over elements (gradient compression) can
// vectorise them.

namespace internal {

inline uint32_t FloatBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return bits;
}

inline float BitsToFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace internal

inline float HalfToFloat(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000) << 16;
  const uint32_t exponent = (half >> 10) & 0x1F;
  uint32_t mantissa = half & 0x3FF;
  uint32_t bits;
  if (exponent == 0x1F) {  // inf / NaN, payload kept
    bits = sign | 0x7F800000 | (mantissa << 13);
  } else if (exponent != 0) {  // normal: rebias 15 -> 127
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {  // signed zero
    bits = sign;
  } else {  // subnormal: normalise, every half subnormal is a float normal
    uint32_t e = 113;
    while ((mantissa & 0x400) == 0) {
      mantissa <<= 1;
      --e;
    }
    bits = sign | (e << 23) | ((mantissa & 0x3FF) << 13);
  }
  return internal::BitsToFloat(bits);
}

inline uint16_t FloatToHalf(float value) {
  const uint32_t bits = internal::FloatBits(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const uint32_t magnitude = bits & 0x7FFFFFFF;
  if (magnitude > 0x7F800000) {  // NaN: quiet it, keep the payload's top bits
    return sign | 0x7E00 | static_cast<uint16_t>((magnitude >> 13) & 0x3FF);
  }
  // 65520 (0x477FF000) is halfway between the largest half, 65504, and 2^16;
  // the tie goes to the even neighbour, infinity.
  if (magnitude >= 0x477FF000) return sign | 0x7C00;
  // 2^-25 (0x33000000) is halfway between 0 and the smallest subnormal,
  // 2^-24; the tie goes to zero.
  if (magnitude <= 0x33000000) return sign;
  uint32_t significand;
  uint32_t shift;  // low bits of `significand` that round away
  if (magnitude >= 0x38800000) {
    // A half normal (>= 2^-14): rebias the exponent 127 -> 15 in place.
    significand = magnitude - (112u << 23);
    shift = 13;
  } else {
    // A half subnormal: the 24-bit significand, its implicit bit made
    // explicit, scaled so that 2^-24 (the smallest subnormal) is 1.
    significand = (magnitude & 0x7FFFFF) | 0x800000;
    shift = 126 - (magnitude >> 23);  // 14..24
  }
  uint32_t result = significand >> shift;
  const uint32_t rest = significand & ((1u << shift) - 1);
  const uint32_t halfway = 1u << (shift - 1);
  // A carry out of the mantissa moves to the next exponent (or from the
  // largest subnormal to the smallest normal), which is the right encoding.
  if (rest > halfway || (rest == halfway && (result & 1) != 0)) ++result;
  return sign | static_cast<uint16_t>(result);
}

inline float Bfloat16ToFloat(uint16_t bf16) {
  return internal::BitsToFloat(static_cast<uint32_t>(bf16) << 16);
}

inline uint16_t FloatToBfloat16(float value) {
  const uint32_t bits = internal::FloatBits(value);
  if ((bits & 0x7FFFFFFF) > 0x7F800000) {
    // NaN: truncation could clear every payload bit left (making infinity),
    // so set the quiet bit.
    return static_cast<uint16_t>((bits >> 16) | 0x0040);
  }
  // Round the low 16 bits away, ties to even; a carry into the exponent is
  // the right encoding, and past the largest finite value it makes infinity.
  const uint32_t round = 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>((bits + round) >> 16);
}

}  // namespace ps

#endif  // PS_COMMON_HALF_H_
