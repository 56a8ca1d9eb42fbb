// "sgd" (sgd.cc): PyTorch's formula, ranges and the last-term variant bit for
// bit against the whole, momentum kept per element.

#include "common/optimizer/optimizer.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace ps {
namespace {

TEST(SgdOptimizerTest, MatchesPytorchFormulaOverSteps) {
  CpuDevice device(0, 1);
  OptimizerOptions options;
  options.sgd.lr = 0.1f;
  options.sgd.momentum = 0.9f;
  options.sgd.weight_decay = 0.01f;
  auto opt = CreateOptimizer(options, 2, &device);
  ASSERT_TRUE(opt.ok()) << opt.status();
  std::vector<float> p = {1.f, -2.f};
  std::vector<double> ref_p = {1.0, -2.0}, buf = {0, 0};
  const std::vector<float> grad_sum = {4.f, 8.f};  // over 4 samples
  for (int step = 0; step < 3; ++step) {
    ASSERT_TRUE((*opt)->Apply(step, 4, grad_sum, absl::MakeSpan(p)).ok());
    for (int i = 0; i < 2; ++i) {
      const double g = grad_sum[i] / 4.0 + 0.01 * ref_p[i];
      buf[i] = 0.9 * buf[i] + g;
      ref_p[i] -= 0.1 * buf[i];
    }
  }
  EXPECT_NEAR(p[0], ref_p[0], 1e-6);
  EXPECT_NEAR(p[1], ref_p[1], 1e-6);
}

TEST(SgdOptimizerTest, RejectsBadOptionsAndSizes) {
  CpuDevice device(0, 1);
  OptimizerOptions bad;
  bad.sgd.momentum = 1.5f;
  EXPECT_EQ(CreateOptimizer(bad, 1, &device).status().code(),
            absl::StatusCode::kInvalidArgument);
  bad = OptimizerOptions();
  bad.sgd.lr = NAN;
  EXPECT_EQ(CreateOptimizer(bad, 1, &device).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto opt = CreateOptimizer(OptimizerOptions(), 2, &device);
  ASSERT_TRUE(opt.ok());
  std::vector<float> p = {1, 2}, g = {1};
  EXPECT_EQ((*opt)->Apply(0, 1, g, absl::MakeSpan(p)).code(), absl::StatusCode::kInvalidArgument);
  std::vector<float> g2 = {1, 1};
  EXPECT_EQ((*opt)->Apply(0, 0, g2, absl::MakeSpan(p)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p, (std::vector<float>{1, 2}));
}

// The server applies each chunk as its sum completes: ranges that tile the
// vector, applied in any order, must give Apply's bits, momentum included.
TEST(SgdOptimizerTest, ApplyRangeOverPiecesEqualsApplyOverTheWhole) {
  CpuDevice device(0, 1);
  for (bool nesterov : {false, true}) {
    OptimizerOptions options;
    options.sgd.lr = 0.05f;
    options.sgd.momentum = 0.9f;
    options.sgd.weight_decay = 0.003f;
    options.sgd.nesterov = nesterov;
    options.schedule.unit = LrSchedule::Unit::kSteps;
    options.schedule.step_size = 2;
    options.schedule.gamma = 0.5f;
    constexpr int64_t kN = 37;
    auto whole = CreateOptimizer(options, kN, &device);
    auto pieces = CreateOptimizer(options, kN, &device);
    ASSERT_TRUE(whole.ok() && pieces.ok());
    std::vector<float> p_whole(kN), p_pieces(kN), grad(kN);
    for (int64_t i = 0; i < kN; ++i) p_whole[i] = p_pieces[i] = std::sin(0.7f * i) * 3.f;
    // Pieces of uneven sizes (an empty one too), applied out of order.
    const std::vector<std::pair<int64_t, int64_t>> ranges = {
        {30, 7}, {0, 5}, {12, 0}, {12, 18}, {5, 7}};
    for (int64_t step = 0; step < 5; ++step) {
      for (int64_t i = 0; i < kN; ++i) grad[i] = std::cos(1.3f * i + step) * 7.f;
      ASSERT_TRUE((*whole)->Apply(step, 3, grad, absl::MakeSpan(p_whole)).ok());
      for (const auto& [offset, n] : ranges) {
        ASSERT_TRUE((*pieces)
                        ->ApplyRange(step, 3, offset, absl::MakeConstSpan(grad).subspan(offset, n),
                                     absl::MakeSpan(p_pieces).subspan(offset, n))
                        .ok());
      }
      for (int64_t i = 0; i < kN; ++i) {
        ASSERT_EQ(p_pieces[i], p_whole[i]) << "step " << step << " element " << i;
        ASSERT_EQ((*pieces)->momentum()[i], (*whole)->momentum()[i]) << i;
      }
    }
    EXPECT_NE(p_whole[1], std::sin(0.7f) * 3.f);  // it did move
  }
}

// The server's last term, read in place from a message's pieces: the update
// equals adding the part into the sum first (or, with no sum started,
// writing 0 + part) and ApplyRange, bit for bit, on one thread and on two,
// with the pieces cut at odd byte offsets (elements straddling two pieces).
TEST(SgdOptimizerTest, ApplyRangeAddingEqualsSummingFirstBitForBit) {
  constexpr int64_t kN = 100003;  // several of ApplyRangeAdding's runs a thread
  constexpr int64_t kOffset = 5;
  for (const int threads : {1, 2}) {
    CpuDevice device(0, threads);
    OptimizerOptions options;
    options.sgd.lr = 0.05f;
    options.sgd.momentum = 0.9f;
    options.sgd.weight_decay = 0.003f;
    auto added = CreateOptimizer(options, kN + kOffset, &device);
    auto fused = CreateOptimizer(options, kN + kOffset, &device);
    ASSERT_TRUE(added.ok() && fused.ok());
    std::vector<float> p_added(kN), p_fused(kN), sum(kN), part(kN);
    for (int64_t i = 0; i < kN; ++i) p_added[i] = p_fused[i] = std::sin(0.7f * i) * 3.f;
    for (int64_t step = 0; step < 4; ++step) {
      const bool started = step % 2 == 0;
      for (int64_t i = 0; i < kN; ++i) {
        sum[i] = std::cos(1.3f * i + step) * 1e7f;
        part[i] = i % 11 == 0 ? -0.f : std::sin(0.1f * i + step);
      }
      // The part's bytes one byte off alignment, cut every 4097 bytes.
      std::string bytes(1, '\0');
      bytes.append(reinterpret_cast<const char*>(part.data()), kN * sizeof(float));
      std::vector<absl::string_view> pieces;
      for (size_t at = 1; at < bytes.size(); at += 4097) {
        pieces.push_back(absl::string_view(bytes).substr(at, 4097));
      }
      std::vector<float> want_sum(kN);
      for (int64_t i = 0; i < kN; ++i) want_sum[i] = started ? sum[i] + part[i] : part[i] + 0.f;
      std::vector<float> out_added(kN), out_fused(kN);
      ASSERT_TRUE((*added)
                      ->ApplyRange(step, 3, kOffset, want_sum, p_added, absl::MakeSpan(out_added))
                      .ok());
      ASSERT_TRUE((*fused)
                      ->ApplyRangeAdding(step, 3, kOffset,
                                         started ? absl::MakeConstSpan(sum)
                                                 : absl::Span<const float>(),
                                         pieces, p_fused, absl::MakeSpan(out_fused))
                      .ok());
      ASSERT_EQ(std::memcmp(out_fused.data(), out_added.data(), kN * sizeof(float)), 0)
          << threads << " threads, step " << step;
      ASSERT_EQ(std::memcmp((*fused)->momentum().data(), (*added)->momentum().data(),
                            (kN + kOffset) * sizeof(float)),
                0);
      p_added = out_added;
      p_fused = out_fused;
    }
    EXPECT_NE(p_fused[1], std::sin(0.7f) * 3.f);  // it did move
  }
}

// An optimizer over 4 parameters with momentum (its buffer shows whether a
// refused call touched it).
std::unique_ptr<Optimizer> FourParametersWithMomentum(CpuDevice* device) {
  OptimizerOptions options;
  options.sgd.momentum = 0.5f;
  auto created = CreateOptimizer(options, 4, device);
  EXPECT_TRUE(created.ok()) << created.status();
  return created.ok() ? std::move(*created) : nullptr;
}

TEST(SgdOptimizerTest, ApplyRangeAddingRejectsSizesThatDoNotMatch) {
  CpuDevice device(0, 1);
  auto opt = FourParametersWithMomentum(&device);
  ASSERT_NE(opt, nullptr);
  std::vector<float> p = {1, 2}, out = {7, 7}, g = {1, 1}, g3 = {1, 1, 1};
  const std::string two(8, '\0'), three(12, '\0'), ragged(7, '\0');
  const absl::string_view piece2[] = {two}, piece3[] = {three}, piece_ragged[] = {ragged};
  EXPECT_EQ(opt->ApplyRangeAdding(0, 1, 0, g, piece3, p, absl::MakeSpan(out)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(opt->ApplyRangeAdding(0, 1, 0, g, piece_ragged, p, absl::MakeSpan(out)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(opt->ApplyRangeAdding(0, 1, 0, g3, piece2, p, absl::MakeSpan(out)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(opt->ApplyRangeAdding(0, 1, 3, g, piece2, p, absl::MakeSpan(out)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(opt->ApplyRangeAdding(0, 0, 0, g, piece2, p, absl::MakeSpan(out)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out, (std::vector<float>{7, 7}));
  for (float m : opt->momentum()) EXPECT_EQ(m, 0.f);
  EXPECT_TRUE(opt->ApplyRangeAdding(0, 1, 2, g, piece2, p, absl::MakeSpan(out)).ok());
}

TEST(SgdOptimizerTest, ApplyRangeRejectsRangesOutsideTheVector) {
  CpuDevice device(0, 1);
  auto opt = FourParametersWithMomentum(&device);
  ASSERT_NE(opt, nullptr);
  std::vector<float> p = {1, 2}, g = {1, 1}, g3 = {1, 1, 1};
  for (int64_t offset : {int64_t{-1}, int64_t{3}, int64_t{5}, INT64_MAX}) {
    absl::Status s = opt->ApplyRange(0, 1, offset, g, absl::MakeSpan(p));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << offset;
  }
  EXPECT_EQ(opt->ApplyRange(0, 1, 0, g3, absl::MakeSpan(p)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(opt->ApplyRange(0, 0, 0, g, absl::MakeSpan(p)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p, (std::vector<float>{1, 2}));
  for (float m : opt->momentum()) EXPECT_EQ(m, 0.f);
  // The last two elements are a valid range.
  ASSERT_TRUE(opt->ApplyRange(0, 1, 2, g, absl::MakeSpan(p)).ok());
  EXPECT_EQ(opt->momentum()[1], 0.f);
  EXPECT_NE(opt->momentum()[2], 0.f);
}

}  // namespace
}  // namespace ps
