#include "common/wire_codec.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/half.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

std::vector<float> Values() {
  return {0.f, -0.f, 1.f, -2.5f, 3.14159f, 1e-3f, -7e-5f, 65504.f, 1e-8f, 123.456f, 0.1f};
}

// The pieces of `bytes` cut at `cuts` (any offsets, so elements straddle).
std::vector<absl::string_view> Cut(const std::string& bytes, std::vector<size_t> cuts) {
  std::vector<absl::string_view> pieces;
  size_t at = 0;
  for (size_t cut : cuts) {
    pieces.push_back(absl::string_view(bytes).substr(at, cut - at));
    at = cut;
  }
  pieces.push_back(absl::string_view(bytes).substr(at));
  return pieces;
}

TEST(WireCodecTest, EachCodecRoundTripsAsItsDtypeRounds) {
  for (const char* name : {"none", "fp16", "bf16"}) {
    SCOPED_TRACE(name);
    auto codec = MakeWireCodec(name);
    ASSERT_TRUE(codec.ok()) << codec.status();
    const std::vector<float> in = Values();
    std::string bytes((*codec)->EncodedBytes(static_cast<int64_t>(in.size())), '\0');
    (*codec)->Encode(in, bytes.data());
    EXPECT_EQ(bytes.size(), std::string(name) == "none" ? 4 * in.size() : 2 * in.size());
    // Whole, and cut at odd offsets (elements straddling pieces).
    for (const auto& pieces : {Cut(bytes, {}), Cut(bytes, {1, 3, 4, 9, 10})}) {
      std::vector<float> out(in.size(), -1.f);
      ASSERT_TRUE((*codec)->Decode(pieces, absl::MakeSpan(out)).ok());
      for (size_t i = 0; i < in.size(); ++i) {
        const float want = std::string(name) == "none" ? in[i]
                           : std::string(name) == "fp16"
                               ? HalfToFloat(FloatToHalf(in[i]))
                               : Bfloat16ToFloat(FloatToBfloat16(in[i]));
        EXPECT_EQ(std::memcmp(&out[i], &want, 4), 0) << i << ": " << out[i] << " vs " << want;
      }
    }
    auto same = WireCodecForDType((*codec)->dtype());
    ASSERT_TRUE(same.ok());
    EXPECT_EQ((*same)->name(), (*codec)->name());
  }
}

TEST(WireCodecTest, AWrongByteCountIsRefusedAndWritesNothing) {
  for (const char* name : {"none", "fp16", "bf16"}) {
    auto codec = MakeWireCodec(name);
    ASSERT_TRUE(codec.ok());
    const std::string bytes(7, '\x3c');
    std::vector<float> out(3, 9.f);
    const absl::Status s = (*codec)->Decode(Cut(bytes, {2}), absl::MakeSpan(out));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_NE(s.message().find("7 bytes"), std::string::npos) << s;
    EXPECT_EQ(out, std::vector<float>(3, 9.f));
  }
}

TEST(WireCodecTest, UnknownNamesAndDtypesAreRefusedByName) {
  auto fp8 = MakeWireCodec("fp8");
  EXPECT_EQ(fp8.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(fp8.status().message().find("'fp8'"), std::string::npos);
  EXPECT_NE(fp8.status().message().find("none, fp16, bf16, topk:F"), std::string::npos);
  for (const char* bad : {"topk:0", "topk:1.5", "topk:x", "topk:"}) {
    EXPECT_EQ(MakeWireCodec(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(WireCodecForDType(DType::kI32).status().code(), absl::StatusCode::kInvalidArgument);
  auto none = MakeWireCodec("");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ((*none)->name(), "none");
}

TEST(WireCodecTest, Fp16OverflowsToInfinityWhichReceiversCanRefuse) {
  auto codec = MakeWireCodec("fp16");
  ASSERT_TRUE(codec.ok());
  const std::vector<float> in = {1e5f};
  std::string bytes(2, '\0');
  (*codec)->Encode(in, bytes.data());
  std::vector<float> out(1);
  ASSERT_TRUE((*codec)->Decode(Cut(bytes, {}), absl::MakeSpan(out)).ok());
  EXPECT_TRUE(std::isinf(out[0]));
}

// Top-k sends the largest magnitudes, indices ascending, 8 bytes each, and
// decodes to zeros elsewhere.
TEST(WireCodecTest, TopKSendsTheLargestValuesAsAscendingPairs) {
  auto codec = MakeWireCodec("topk:0.3");
  ASSERT_TRUE(codec.ok()) << codec.status();
  EXPECT_TRUE((*codec)->sparse());
  const std::vector<float> in = {0.1f, -5.f, 0.2f, 3.f, -0.3f, 0.f, 4.f, 0.05f, 0.f, -0.2f};
  EXPECT_EQ((*codec)->EncodedBytes(10), 8 * 3);  // ceil(0.3 * 10)
  EXPECT_EQ((*codec)->EncodedBytes(1), 8);       // at least one
  std::string bytes(24, '\0');
  (*codec)->Encode(in, bytes.data());
  std::vector<float> out(10, 7.f);
  const absl::string_view piece(bytes);
  ASSERT_TRUE((*codec)->Decode(absl::MakeConstSpan(&piece, 1), absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, (std::vector<float>{0, -5.f, 0, 3.f, 0, 0, 4.f, 0, 0, 0}));
  uint32_t first;
  std::memcpy(&first, bytes.data(), 4);
  EXPECT_EQ(first, 1u);
}

// Error feedback loses nothing: over any number of steps, what was sent
// plus what is left in the residual is what was pushed (exactly, for
// values that add without rounding).
TEST(WireCodecTest, TopKErrorFeedbackKeepsEveryUnsentPart) {
  auto codec = MakeWireCodec("topk:0.25");
  ASSERT_TRUE(codec.ok());
  constexpr int kN = 16;
  std::vector<float> residual(kN, 0.f), sent_total(kN, 0.f), pushed_total(kN, 0.f);
  for (int step = 0; step < 20; ++step) {
    std::vector<float> g(kN);
    for (int i = 0; i < kN; ++i) g[i] = static_cast<float>((i * 7 + step * 3) % 11 - 5) / 8.f;
    for (int i = 0; i < kN; ++i) pushed_total[i] += g[i];
    std::string bytes((*codec)->EncodedBytes(kN), '\0');
    (*codec)->Encode(g, absl::MakeSpan(residual), bytes.data());
    std::vector<float> sent(kN);
    const absl::string_view piece(bytes);
    ASSERT_TRUE((*codec)->Decode(absl::MakeConstSpan(&piece, 1), absl::MakeSpan(sent)).ok());
    int nonzero = 0;
    for (int i = 0; i < kN; ++i) {
      sent_total[i] += sent[i];
      nonzero += sent[i] != 0.f;
      // Where a value was sent, nothing of it is left behind.
      if (sent[i] != 0.f) {
        EXPECT_EQ(residual[i], 0.f);
      }
    }
    EXPECT_LE(nonzero, 4);
  }
  for (int i = 0; i < kN; ++i) EXPECT_EQ(sent_total[i] + residual[i], pushed_total[i]) << i;
  // Without the residual the unsent parts would be gone.
  std::vector<float> g(kN, 0.125f);
  g[0] = 1.f;
  std::string bytes((*codec)->EncodedBytes(kN), '\0');
  (*codec)->Encode(g, bytes.data());
  std::vector<float> sent(kN);
  const absl::string_view piece(bytes);
  ASSERT_TRUE((*codec)->Decode(absl::MakeConstSpan(&piece, 1), absl::MakeSpan(sent)).ok());
  float lost = 0;
  for (int i = 0; i < kN; ++i) lost += g[i] - sent[i];
  EXPECT_GT(lost, 1.f);  // 12 of the 16 values of 0.125 never sent
}

TEST(WireCodecTest, AMalformedTopKChunkIsRefusedByItsProblem) {
  auto pairs = [](std::vector<std::pair<uint32_t, float>> p) {
    std::string bytes;
    for (const auto& [i, v] : p) {
      bytes.append(reinterpret_cast<const char*>(&i), 4);
      bytes.append(reinterpret_cast<const char*>(&v), 4);
    }
    return bytes;
  };
  const struct {
    std::string bytes;
    const char* problem;
  } cases[] = {
      {pairs({{1, 1.f}, {9, 2.f}}), "out of range"},
      {pairs({{3, 1.f}, {2, 2.f}}), "strictly ascending"},
      {pairs({{2, 1.f}, {2, 2.f}}), "strictly ascending"},
      {pairs({{1, NAN}}), "not finite"},
      {pairs({{1, 1.f}}).substr(0, 7), "not whole"},
      {pairs({{0, 1}, {1, 1}, {2, 1}, {3, 1}, {4, 1}}), "5 pairs for a chunk of 4"},
  };
  for (const auto& c : cases) {
    std::vector<float> out(4, 7.f);
    const absl::string_view piece(c.bytes);
    const absl::Status s = DecodeTopK(absl::MakeConstSpan(&piece, 1), absl::MakeSpan(out));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.problem;
    EXPECT_NE(s.message().find(c.problem), std::string::npos) << s;
    EXPECT_EQ(out, std::vector<float>(4, 7.f));
  }
}

// A delta pull's chunk: the elements whose bits changed (-0 from +0 too),
// counted up to a limit, encoded as ascending pairs, and applied over the
// old version to give the new one exactly; a malformed delta writes nothing.
TEST(WireCodecTest, DeltaCarriesExactlyWhatChanged) {
  const std::vector<float> before = {1.f, 2.f, 0.f, 4.f, 5.f, 6.f};
  const std::vector<float> now = {1.f, 2.5f, -0.f, 4.f, 5.f, -6.f};
  EXPECT_EQ(CountChanged(now, before, 100), 3);
  EXPECT_EQ(CountChanged(now, before, 2), 2);  // stops at the limit
  EXPECT_EQ(CountChanged(before, before, 100), 0);
  std::string bytes(3 * 8, '\0');
  EncodeChanged(now, before, bytes.data());
  uint32_t first_index = 0;
  std::memcpy(&first_index, bytes.data(), 4);
  EXPECT_EQ(first_index, 1u);
  std::vector<float> held = before;
  const absl::string_view piece(bytes);
  ASSERT_TRUE(ApplyDelta(absl::MakeConstSpan(&piece, 1), absl::MakeSpan(held)).ok());
  EXPECT_EQ(0, std::memcmp(held.data(), now.data(), sizeof(float) * now.size()));
  // Out of order: refused, nothing written.
  std::string swapped = bytes.substr(8, 8) + bytes.substr(0, 8);
  const absl::string_view bad(swapped);
  held = before;
  EXPECT_EQ(ApplyDelta(absl::MakeConstSpan(&bad, 1), absl::MakeSpan(held)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(held, before);
}

}  // namespace
}  // namespace ps
