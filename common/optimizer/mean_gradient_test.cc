// "none" (mean_gradient.cc): the mean gradient, exactly as stated, never
// reading the parameters; the last-term variant bit for bit; loss scaling.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "common/optimizer/optimizer.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

std::unique_ptr<Optimizer> MeanGradientOver(int64_t n, CpuDevice* device) {
  OptimizerOptions options;
  options.kind = kMeanGradientOptimizer;
  auto created = CreateOptimizer(options, n, device);
  EXPECT_TRUE(created.ok()) << created.status();
  return created.ok() ? std::move(*created) : nullptr;
}

// Parameters that must never be read: NaN would show in the output.
std::vector<float> Unreadable(int64_t n) {
  return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN());
}

TEST(MeanGradientTest, WritesTheSumTimesOneOverTheSamples) {
  CpuDevice device(0, 1);
  auto opt = MeanGradientOver(4, &device);
  ASSERT_NE(opt, nullptr);
  const std::vector<float> params = Unreadable(4);
  std::vector<float> out(4, 7.f);
  // A power of two: exact.
  ASSERT_TRUE(opt->ApplyRange(0, 4, 0, {4.f, -8.f, 2.f, 0.f}, params, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, (std::vector<float>{1.f, -2.f, 0.5f, 0.f}));
  // 3 samples: the sum times the float nearest 1/3, SGD's factor, whatever
  // the step (no schedule).
  const std::vector<float> sum = {3.f, -6.f, 1.5f, 1e-3f};
  ASSERT_TRUE(opt->ApplyRange(41, 3, 0, sum, params, absl::MakeSpan(out)).ok());
  const float third = 1.f / 3.f;
  for (int j = 0; j < 4; ++j) {
    EXPECT_EQ(out[j], third * sum[j]) << j;
    EXPECT_NEAR(out[j], sum[j] / 3.0, 1e-7) << j;
  }
  // A range at an offset, in place: the same values.
  std::vector<float> in_place = {3.f, -6.f};
  ASSERT_TRUE(opt->ApplyRange(0, 3, 2, in_place, absl::MakeSpan(in_place)).ok());
  EXPECT_EQ(in_place, (std::vector<float>{third * 3.f, third * -6.f}));
  std::vector<float> whole = {4.f, 8.f, 12.f, 16.f};
  ASSERT_TRUE(opt->Apply(0, 4, whole, absl::MakeSpan(whole)).ok());
  EXPECT_EQ(whole, (std::vector<float>{1.f, 2.f, 3.f, 4.f}));
  EXPECT_TRUE(opt->momentum().empty());
  EXPECT_TRUE(opt->RestoreMomentum({}).ok());
  const std::vector<float> some(4, 0.f);
  EXPECT_EQ(opt->RestoreMomentum(some).code(), absl::StatusCode::kInvalidArgument);
}

// The workers multiplied their loss by the scale: it is divided out in the
// same factor, exactly (a power of two).
TEST(MeanGradientTest, DividesByTheLossScale) {
  CpuDevice device(0, 1);
  auto opt = MeanGradientOver(3, &device);
  ASSERT_NE(opt, nullptr);
  const std::vector<float> params = Unreadable(3);
  std::vector<float> out(3);
  ASSERT_TRUE(opt->ApplyRange(0, 2, 0, {2048.f, -1024.f, 3.f}, params, absl::MakeSpan(out),
                              /*loss_scale=*/1024.f)
                  .ok());
  EXPECT_EQ(out, (std::vector<float>{1.f, -0.5f, 3.f / 2048.f}));
}

// The last term read in place from a message's pieces: the output equals
// adding the part into the sum first (or writing 0 + part) and ApplyRange,
// bit for bit, on one thread and on two, with elements straddling pieces.
TEST(MeanGradientTest, ApplyRangeAddingEqualsSummingFirstBitForBit) {
  constexpr int64_t kN = 50003;  // several runs a thread
  constexpr int64_t kOffset = 3;
  for (const int threads : {1, 2}) {
    CpuDevice device(0, threads);
    auto opt = MeanGradientOver(kN + kOffset, &device);
    ASSERT_NE(opt, nullptr);
    const std::vector<float> params = Unreadable(kN);
    std::vector<float> sum(kN), part(kN);
    for (int64_t i = 0; i < kN; ++i) {
      sum[i] = std::cos(1.3f * i) * 1e7f;
      part[i] = i % 11 == 0 ? -0.f : std::sin(0.1f * i);
    }
    std::string bytes(1, '\0');  // one byte off alignment, cut every 4097 bytes
    bytes.append(reinterpret_cast<const char*>(part.data()), kN * sizeof(float));
    std::vector<absl::string_view> pieces;
    for (size_t at = 1; at < bytes.size(); at += 4097) {
      pieces.push_back(absl::string_view(bytes).substr(at, 4097));
    }
    for (const bool started : {true, false}) {
      std::vector<float> summed(kN);
      for (int64_t i = 0; i < kN; ++i) summed[i] = started ? sum[i] + part[i] : part[i] + 0.f;
      std::vector<float> want(kN), got(kN);
      ASSERT_TRUE(opt->ApplyRange(0, 7, kOffset, summed, params, absl::MakeSpan(want), 4.f).ok());
      ASSERT_TRUE(opt->ApplyRangeAdding(0, 7, kOffset,
                                        started ? absl::MakeConstSpan(sum)
                                                : absl::Span<const float>(),
                                        pieces, params, absl::MakeSpan(got), 4.f)
                      .ok());
      ASSERT_EQ(std::memcmp(got.data(), want.data(), kN * sizeof(float)), 0)
          << threads << " threads, started " << started;
      const float scale = 1.f / 7.f / 4.f;
      EXPECT_EQ(got[5], scale * (started ? sum[5] + part[5] : part[5]));
      if (!started) {
        EXPECT_FALSE(std::signbit(got[0]));  // 0 + -0 is +0
      }
    }
  }
}

}  // namespace
}  // namespace ps
