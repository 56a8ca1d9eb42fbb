#include "common/half.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace ps {
namespace {

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

float FromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

bool IsHalfNan(uint16_t h) { return (h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0; }

TEST(HalfTest, HalfToFloatKnownValues) {
  EXPECT_EQ(HalfToFloat(0x3C00), 1.f);
  EXPECT_EQ(HalfToFloat(0xC000), -2.f);
  EXPECT_EQ(HalfToFloat(0x3800), 0.5f);
  EXPECT_EQ(HalfToFloat(0x3555), 0.333251953125f);
  EXPECT_EQ(HalfToFloat(0x7BFF), 65504.f);                      // largest finite
  EXPECT_EQ(HalfToFloat(0x0400), std::ldexp(1.f, -14));         // smallest normal
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.f, -24));         // smallest subnormal
  EXPECT_EQ(HalfToFloat(0x03FF), 1023 * std::ldexp(1.f, -24));  // largest subnormal
  EXPECT_EQ(Bits(HalfToFloat(0x0000)), 0u);
  EXPECT_EQ(Bits(HalfToFloat(0x8000)), 0x80000000u);  // -0 keeps its sign
  EXPECT_EQ(HalfToFloat(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(HalfToFloat(0xFC00), -std::numeric_limits<float>::infinity());
  // NaN payloads (quiet or signalling) move to the float's top mantissa bits.
  EXPECT_EQ(Bits(HalfToFloat(0x7E00)), 0x7FC00000u);
  EXPECT_EQ(Bits(HalfToFloat(0xFC01)), 0xFF802000u);
}

TEST(HalfTest, EveryHalfConvertsExactlyAndRoundTrips) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const uint16_t half = static_cast<uint16_t>(h);
    const float f = HalfToFloat(half);
    if (IsHalfNan(half)) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << h;
      EXPECT_TRUE(IsHalfNan(FloatToHalf(f))) << std::hex << h;
      continue;
    }
    EXPECT_EQ(FloatToHalf(f), half) << std::hex << h << " -> " << f;
#ifdef __FLT16_MAX__
    _Float16 reference;
    std::memcpy(&reference, &half, 2);
    EXPECT_EQ(Bits(f), Bits(static_cast<float>(reference))) << std::hex << h;
#endif
  }
}

TEST(HalfTest, FloatToHalfRoundsToNearestEven) {
  const auto ulp = [](int exponent) { return std::ldexp(1.f, exponent); };
  // Between 1 (0x3C00) and the next half, 1 + 2^-10: a tie goes to the even
  // mantissa, anything past it rounds up.
  EXPECT_EQ(FloatToHalf(1.f + ulp(-11)), 0x3C00);
  EXPECT_EQ(FloatToHalf(std::nextafter(1.f + ulp(-11), 2.f)), 0x3C01);
  EXPECT_EQ(FloatToHalf(1.f + 3 * ulp(-11)), 0x3C02);  // tie, up to even
  EXPECT_EQ(FloatToHalf(-1.f - 3 * ulp(-11)), 0xBC02);
  // A carry out of the mantissa moves to the next exponent.
  EXPECT_EQ(FloatToHalf(2.f - ulp(-12)), 0x4000);
  // Overflow: 65520 is the tie between 65504 (odd) and 2^16, so it becomes
  // infinity, and everything below it stays finite.
  EXPECT_EQ(FloatToHalf(65504.f), 0x7BFF);
  EXPECT_EQ(FloatToHalf(std::nextafter(65520.f, 0.f)), 0x7BFF);
  EXPECT_EQ(FloatToHalf(65520.f), 0x7C00);
  EXPECT_EQ(FloatToHalf(-1e10f), 0xFC00);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::max()), 0x7C00);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(FloatToHalf(-std::numeric_limits<float>::infinity()), 0xFC00);
  // Subnormals, counted in units of 2^-24.
  EXPECT_EQ(FloatToHalf(2.5f * ulp(-24)), 0x0002);  // tie, down to even
  EXPECT_EQ(FloatToHalf(3.5f * ulp(-24)), 0x0004);  // tie, up to even
  EXPECT_EQ(FloatToHalf(0.75f * ulp(-24)), 0x0001);
  EXPECT_EQ(FloatToHalf(ulp(-25)), 0x0000);  // tie between 0 and 2^-24
  EXPECT_EQ(FloatToHalf(std::nextafter(ulp(-25), 1.f)), 0x0001);
  EXPECT_EQ(FloatToHalf(-ulp(-26)), 0x8000);  // underflow keeps the sign
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::denorm_min()), 0x0000);
  // The largest subnormal rounds up into the smallest normal.
  EXPECT_EQ(FloatToHalf(1023.5f * ulp(-24)), 0x0400);
  EXPECT_EQ(FloatToHalf(1022.5f * ulp(-24)), 0x03FE);
  EXPECT_EQ(FloatToHalf(0.f), 0x0000);
  EXPECT_EQ(FloatToHalf(-0.f), 0x8000);
}

TEST(HalfTest, FloatToHalfKeepsNanQuiet) {
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::quiet_NaN()), 0x7E00);
  EXPECT_EQ(FloatToHalf(-std::numeric_limits<float>::quiet_NaN()), 0xFE00);
  // A signalling NaN whose payload lies in the bits that drop out would
  // truncate to infinity; it becomes a quiet NaN instead.
  EXPECT_EQ(FloatToHalf(FromBits(0x7F800001)), 0x7E00);
  EXPECT_EQ(FloatToHalf(FromBits(0x7FA02000)), 0x7F01);  // payload's top bits kept
}

#ifdef __FLT16_MAX__
// The compiler's conversion (F16C's vcvtps2ph with -march=x86-64-v3, libgcc
// otherwise) rounds to nearest even too: compare on every tie between two
// halves, the floats either side of it, and a sweep over all floats.
TEST(HalfTest, FloatToHalfMatchesTheCompiler) {
  const auto check = [](uint32_t bits) {
    const float f = FromBits(bits);
    if (std::isnan(f)) return;
    const _Float16 reference = static_cast<_Float16>(f);
    uint16_t want;
    std::memcpy(&want, &reference, 2);
    ASSERT_EQ(FloatToHalf(f), want) << std::hex << "float bits 0x" << bits << " (" << f << ")";
  };
  for (uint32_t h = 0; h < 0x7C00; ++h) {
    const float lo = HalfToFloat(static_cast<uint16_t>(h));
    const float hi = h + 1 == 0x7C00 ? 65536.f : HalfToFloat(static_cast<uint16_t>(h + 1));
    const uint32_t tie = Bits(0.5f * (lo + hi));  // exact: one more bit than a half
    for (uint32_t b : {tie - 1, tie, tie + 1}) {
      check(b);
      check(b | 0x80000000);
    }
  }
  for (uint64_t bits = 0; bits <= 0xFFFFFFFF; bits += 257) check(static_cast<uint32_t>(bits));
}
#endif

TEST(HalfTest, Bfloat16IsTheTopOfAFloat) {
  EXPECT_EQ(Bfloat16ToFloat(0x3F80), 1.f);
  EXPECT_EQ(Bfloat16ToFloat(0xC020), -2.5f);
  EXPECT_EQ(Bfloat16ToFloat(0x7F80), std::numeric_limits<float>::infinity());
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    const float f = Bfloat16ToFloat(static_cast<uint16_t>(b));
    ASSERT_EQ(Bits(f), b << 16);
    if (!std::isnan(f)) {
      ASSERT_EQ(FloatToBfloat16(f), b);  // representable: no rounding
    }
  }
}

TEST(HalfTest, FloatToBfloat16RoundsToNearestEven) {
  const float ulp = std::ldexp(1.f, -7);  // of bf16 at 1
  EXPECT_EQ(FloatToBfloat16(1.f + ulp / 2), 0x3F80);  // tie, down to even
  EXPECT_EQ(FloatToBfloat16(std::nextafter(1.f + ulp / 2, 2.f)), 0x3F81);  // not truncated
  EXPECT_EQ(FloatToBfloat16(1.f + 1.5f * ulp), 0x3F82);  // tie, up to even
  EXPECT_EQ(FloatToBfloat16(-1.f - 1.5f * ulp), 0xBF82);
  EXPECT_EQ(FloatToBfloat16(2.f - ulp / 4), 0x4000);  // carry into the exponent
  EXPECT_EQ(FloatToBfloat16(FromBits(0x7F7F7FFF)), 0x7F7F);  // just below the tie: finite
  EXPECT_EQ(FloatToBfloat16(std::numeric_limits<float>::max()), 0x7F80);  // overflows to inf
  EXPECT_EQ(FloatToBfloat16(-std::numeric_limits<float>::infinity()), 0xFF80);
  EXPECT_EQ(FloatToBfloat16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(FloatToBfloat16(FromBits(0x00018000)), 0x0002);  // subnormal tie, up to even
  EXPECT_EQ(FloatToBfloat16(-0.f), 0x8000);
  // NaN stays NaN, quiet, sign kept; a payload only in the low bits must not
  // truncate to infinity.
  EXPECT_EQ(FloatToBfloat16(std::numeric_limits<float>::quiet_NaN()), 0x7FC0);
  EXPECT_EQ(FloatToBfloat16(FromBits(0x7F800001)), 0x7FC0);
  EXPECT_EQ(FloatToBfloat16(FromBits(0xFFA00000)), 0xFFE0);
}

// An independent reference: of the two bf16 neighbours of `f`, the nearer
// (compared exactly in double), the even one on a tie.
uint16_t ReferenceBfloat16(float f) {
  const uint32_t lo = Bits(f) & 0xFFFF0000;  // towards zero
  const uint32_t hi = lo + 0x10000;          // away from zero (may be infinity)
  const double lo_value = std::fabs(static_cast<double>(FromBits(lo)));
  const double hi_value = (hi & 0x7FFFFFFF) == 0x7F800000
                              ? std::ldexp(1.0, 128)
                              : std::fabs(static_cast<double>(FromBits(hi)));
  const double x = std::fabs(static_cast<double>(f));
  const double down = x - lo_value, up = hi_value - x;
  if (down < up || (down == up && ((lo >> 16) & 1) == 0)) return static_cast<uint16_t>(lo >> 16);
  return static_cast<uint16_t>(hi >> 16);
}

TEST(HalfTest, FloatToBfloat16MatchesAReference) {
  for (uint64_t bits = 0; bits <= 0xFFFFFFFF; bits += 251) {
    const float f = FromBits(static_cast<uint32_t>(bits));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToBfloat16(f), ReferenceBfloat16(f)) << std::hex << "float bits 0x" << bits;
  }
  // Every tie and its neighbours.
  for (uint32_t top = 0; top < 0x7F80; ++top) {
    const uint32_t tie = (top << 16) | 0x8000;
    for (uint32_t b : {tie - 1, tie, tie + 1, (tie - 1) | 0x80000000, tie | 0x80000000}) {
      ASSERT_EQ(FloatToBfloat16(FromBits(b)), ReferenceBfloat16(FromBits(b))) << std::hex << b;
    }
  }
}

TEST(HalfTest, SpanVersionsConvertEachElement) {
  const std::vector<float> values = {0.f, -1.5f, 65504.f, 1e-7f, 3.14159f, -1e9f};
  std::vector<uint16_t> halves(values.size()), bf16s(values.size());
  FloatToHalf(values, absl::MakeSpan(halves));
  FloatToBfloat16(values, absl::MakeSpan(bf16s));
  std::vector<float> from_halves(values.size()), from_bf16s(values.size());
  HalfToFloat(halves, absl::MakeSpan(from_halves));
  Bfloat16ToFloat(bf16s, absl::MakeSpan(from_bf16s));
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(halves[i], FloatToHalf(values[i])) << i;
    EXPECT_EQ(bf16s[i], FloatToBfloat16(values[i])) << i;
    EXPECT_EQ(from_halves[i], HalfToFloat(halves[i])) << i;
    EXPECT_EQ(from_bf16s[i], Bfloat16ToFloat(bf16s[i])) << i;
  }
  EXPECT_EQ(from_halves[1], -1.5f);
  EXPECT_EQ(halves[5], 0xFC00);
}

}  // namespace
}  // namespace ps
