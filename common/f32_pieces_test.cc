#include "common/f32_pieces.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ps {
namespace {

// `values` as little-endian bytes, one byte of padding first so no piece is
// aligned, cut at every `cuts` byte offset (sorted).
struct Cut {
  std::string storage;
  std::vector<absl::string_view> pieces;
};

Cut CutAt(const std::vector<float>& values, const std::vector<size_t>& cuts) {
  Cut cut;
  cut.storage.assign(1, '\x7f');
  cut.storage.append(reinterpret_cast<const char*>(values.data()), values.size() * 4);
  const char* base = cut.storage.data() + 1;
  size_t begin = 0;
  for (size_t at : cuts) {
    cut.pieces.emplace_back(base + begin, at - begin);
    begin = at;
  }
  cut.pieces.emplace_back(base + begin, values.size() * 4 - begin);
  return cut;
}

TEST(F32PiecesTest, SumsChecksAndCopiesWhateverTheCuts) {
  const std::vector<float> values = {1.5f, -2.f, 3.25f, 4.f, 5.f, -6.5f, 7.f};
  // Every single cut and every pair of cuts, empty pieces included.
  for (size_t a = 0; a <= values.size() * 4; ++a) {
    for (size_t b = a; b <= values.size() * 4; ++b) {
      Cut cut = CutAt(values, {a, b});
      EXPECT_EQ(PiecesBytes(cut.pieces), 28);
      std::vector<float> sum(values.size(), 10.f), copy(values.size());
      AddPiecesTo(cut.pieces, sum.data());
      std::vector<float> first(values.size(), 99.f);
      AssignPiecesTo(cut.pieces, first.data());
      EXPECT_EQ(first, values) << "cuts " << a << ", " << b;
      CopyPiecesTo(cut.pieces, copy.data());
      for (size_t i = 0; i < values.size(); ++i) {
        EXPECT_EQ(sum[i], 10.f + values[i]) << "cuts " << a << ", " << b << " element " << i;
        EXPECT_EQ(copy[i], values[i]) << "cuts " << a << ", " << b << " element " << i;
      }
      float bad = 0;
      EXPECT_EQ(FirstNonFinite(cut.pieces, &bad), -1);
    }
  }
}

TEST(F32PiecesTest, FindsTheFirstNonFiniteElementAcrossACut) {
  std::vector<float> values(9, 1.f);
  values[4] = INFINITY;
  values[7] = NAN;
  for (size_t a = 0; a <= values.size() * 4; ++a) {
    Cut cut = CutAt(values, {a});
    float bad = 0;
    EXPECT_EQ(FirstNonFinite(cut.pieces, &bad), 4) << "cut at " << a;
    EXPECT_EQ(bad, INFINITY);
  }
  values[4] = 1.f;
  Cut cut = CutAt(values, {29, 30});  // element 7 straddles three pieces
  float bad = 0;
  EXPECT_EQ(FirstNonFinite(cut.pieces, &bad), 7);
  EXPECT_TRUE(std::isnan(bad));
}

TEST(F32PiecesTest, AssignIsAddingToZeroBitForBit) {
  const std::vector<float> values = {-0.f, 0.f, -1.f};
  Cut cut = CutAt(values, {5});
  std::vector<float> out(3, 7.f);
  AssignPiecesTo(cut.pieces, out.data());
  EXPECT_FALSE(std::signbit(out[0]));  // 0 + -0 is +0
  EXPECT_FALSE(std::signbit(out[1]));
  EXPECT_EQ(out[2], -1.f);
}

TEST(F32PiecesTest, RunsCoverEveryElementOnceWhateverTheCuts) {
  const std::vector<float> values = {1.5f, -2.f, 3.25f, 4.f, 5.f, -6.5f, 7.f};
  for (size_t a = 0; a <= values.size() * 4; ++a) {
    for (size_t b = a; b <= values.size() * 4; ++b) {
      for (const int64_t max_count : {1, 2, 100}) {
        Cut cut = CutAt(values, {a, b});
        const std::vector<F32Run> runs = F32Runs(cut.pieces, max_count);
        int64_t next = 0;
        for (const F32Run& run : runs) {
          EXPECT_EQ(run.first, next) << "cuts " << a << ", " << b;
          EXPECT_GE(run.count, 1);
          EXPECT_LE(run.count, max_count);
          for (int64_t i = 0; i < run.count; ++i) {
            float value;
            std::memcpy(&value, static_cast<const char*>(run.data()) + 4 * i, 4);
            EXPECT_EQ(value, values[run.first + i]) << "cuts " << a << ", " << b;
          }
          next += run.count;
        }
        EXPECT_EQ(next, static_cast<int64_t>(values.size())) << "cuts " << a << ", " << b;
      }
    }
  }
  // A run may be cut only where max_count says: one uncut piece is one run.
  Cut whole = CutAt(values, {});
  EXPECT_EQ(F32Runs(whole.pieces, 100).size(), 1u);
  EXPECT_EQ(F32Runs(whole.pieces, 3).size(), 3u);
}

TEST(F32PiecesTest, NoPiecesAreNoElements) {
  float bad = 0;
  EXPECT_EQ(PiecesBytes({}), 0);
  EXPECT_EQ(FirstNonFinite({}, &bad), -1);
}

}  // namespace
}  // namespace ps
