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
  auto topk = MakeWireCodec("topk:0.01");
  EXPECT_EQ(topk.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(topk.status().message().find("'topk:0.01'"), std::string::npos);
  EXPECT_NE(topk.status().message().find("none, fp16, bf16"), std::string::npos);
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

}  // namespace
}  // namespace ps
