#include "server/rank_order_sum.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "absl/strings/string_view.h"
#include "gtest/gtest.h"

namespace ps::server {
namespace {

constexpr int kWorkers = 4;
constexpr int64_t kLength = 7;

// Values whose float sum depends on the order of its terms.
std::vector<std::vector<float>> Parts(unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> exponent(-20.f, 20.f);
  std::vector<std::vector<float>> parts(kWorkers, std::vector<float>(kLength));
  for (auto& part : parts) {
    for (float& v : part) v = std::ldexp(exponent(rng) > 0 ? 1.1f : -0.7f, exponent(rng));
  }
  return parts;
}

std::vector<float> InRankOrder(const std::vector<std::vector<float>>& parts,
                               const std::vector<bool>& waived) {
  std::vector<float> sum(kLength, 0.f);
  for (int r = 0; r < kWorkers; ++r) {
    if (waived[r]) continue;
    for (int64_t i = 0; i < kLength; ++i) sum[i] += parts[r][i];
  }
  return sum;
}

// One part as several pieces cut at odd byte offsets, as a received
// message's slices are.
struct Pieces {
  explicit Pieces(const std::vector<float>& values) {
    bytes.resize(values.size() * sizeof(float));
    std::memcpy(bytes.data(), values.data(), bytes.size());
    const absl::string_view all(bytes.data(), bytes.size());
    for (size_t begin = 0; begin < all.size(); begin += 5) pieces.push_back(all.substr(begin, 5));
  }
  F32Pieces span() const { return pieces; }
  std::vector<char> bytes;
  std::vector<absl::string_view> pieces;
};

bool BitEqual(absl::Span<const float> a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), b.size() * sizeof(float)) == 0;
}

TEST(RankOrderSumTest, EveryArrivalOrderGivesTheRankOrderSumBitForBit) {
  const auto parts = Parts(1);
  const std::vector<bool> none(kWorkers, false);
  const std::vector<float> expected = InRankOrder(parts, none);
  std::vector<int> order(kWorkers);
  std::iota(order.begin(), order.end(), 0);
  RankOrderSum sum;
  sum.Reset(kLength, kWorkers);
  int orders = 0;
  do {
    int64_t held = 0, most_held = 0;
    for (int rank : order) {
      held += sum.Add(rank, Pieces(parts[rank]).span(), none);
      most_held = std::max(most_held, held);
    }
    EXPECT_EQ(held, 0) << "every held part is summed once the last arrives";
    // Held only what arrived before a lower rank: at most num_workers - 1.
    EXPECT_LE(most_held, (kWorkers - 1) * kLength);
    if (std::is_sorted(order.begin(), order.end())) EXPECT_EQ(most_held, 0);
    EXPECT_TRUE(sum.started());
    EXPECT_TRUE(BitEqual(sum.values(), expected));
    sum.Restart();
    ++orders;
  } while (std::next_permutation(order.begin(), order.end()));
  EXPECT_EQ(orders, 24);
  // The order matters for these values: a reversed sum differs somewhere.
  std::vector<float> reversed(kLength, 0.f);
  for (int r = kWorkers - 1; r >= 0; --r) {
    for (int64_t i = 0; i < kLength; ++i) reversed[i] += parts[r][i];
  }
  EXPECT_FALSE(BitEqual(absl::MakeConstSpan(reversed), expected));
}

TEST(RankOrderSumTest, WaivedRanksAreSkippedAndAHeldPartCanStartTheSum) {
  const auto parts = Parts(2);
  const std::vector<bool> waived = {true, false, true, false};
  RankOrderSum sum;
  sum.Reset(kLength, kWorkers);
  EXPECT_EQ(sum.Add(3, Pieces(parts[3]).span(), waived), kLength);  // held for rank 1
  EXPECT_FALSE(sum.started());
  EXPECT_EQ(sum.Add(1, Pieces(parts[1]).span(), waived), -kLength);
  EXPECT_TRUE(BitEqual(sum.values(), InRankOrder(parts, waived)));
}

TEST(RankOrderSumTest, TheFirstTermOverwritesTheLastIterationsSum) {
  const std::vector<bool> none(kWorkers, false);
  RankOrderSum sum;
  sum.Reset(kLength, kWorkers);
  for (int r = 0; r < kWorkers; ++r) {
    sum.Add(r, Pieces(std::vector<float>(kLength, 5.f)).span(), none);
  }
  sum.Restart();
  // -0 + nothing else: the sum starts as 0 + (-0) = +0, not from the old 20.
  const std::vector<float> negative_zero(kLength, -0.f);
  sum.Add(0, Pieces(negative_zero).span(), none);
  for (int r = 1; r < kWorkers; ++r) {
    sum.Add(r, Pieces(std::vector<float>(kLength, 0.f)).span(), none);
  }
  EXPECT_TRUE(BitEqual(sum.values(), std::vector<float>(kLength, 0.f)));
}

TEST(RankOrderSumTest, WaivingAMissingRankSumsThePartsHeldForIt) {
  const auto parts = Parts(5);
  std::vector<bool> waived(kWorkers, false);
  RankOrderSum sum;
  sum.Reset(kLength, kWorkers);
  sum.Add(0, Pieces(parts[0]).span(), waived);
  EXPECT_EQ(sum.Add(2, Pieces(parts[2]).span(), waived), kLength);  // waits for rank 1
  EXPECT_EQ(sum.SumHeldInTurn(waived), 0);  // rank 1 still expected
  waived[1] = true;  // rank 1 dropped out
  EXPECT_EQ(sum.SumHeldInTurn(waived), kLength);
  sum.Add(3, Pieces(parts[3]).span(), waived);
  EXPECT_TRUE(BitEqual(sum.values(), InRankOrder(parts, waived)));
}

TEST(RankOrderSumTest, IsLastTermOnlyWhenLowerRanksAreInAndHigherOnesWaived) {
  const auto parts = Parts(3);
  std::vector<bool> waived(kWorkers, false);
  RankOrderSum sum;
  sum.Reset(kLength, kWorkers);
  EXPECT_FALSE(sum.IsLastTerm(3, Pieces(parts[3]).span(), waived));  // 0..2 missing
  for (int r = 0; r < 3; ++r) sum.Add(r, Pieces(parts[r]).span(), waived);
  EXPECT_TRUE(sum.IsLastTerm(3, Pieces(parts[3]).span(), waived));
  EXPECT_FALSE(sum.IsLastTerm(3, Pieces({}).span(), waived)) << "an empty part";
  sum.Restart();
  sum.Add(0, Pieces(parts[0]).span(), waived);
  EXPECT_FALSE(sum.IsLastTerm(1, Pieces(parts[1]).span(), waived));  // 2 and 3 to come
  waived[2] = waived[3] = true;
  EXPECT_TRUE(sum.IsLastTerm(1, Pieces(parts[1]).span(), waived));
}

TEST(RankOrderSumTest, DropHeldFreesWhatWasHeld) {
  const auto parts = Parts(4);
  const std::vector<bool> none(kWorkers, false);
  RankOrderSum sum;
  sum.Reset(kLength, kWorkers);
  EXPECT_EQ(sum.Add(2, Pieces(parts[2]).span(), none), kLength);
  EXPECT_EQ(sum.Add(3, Pieces(parts[3]).span(), none), kLength);
  EXPECT_EQ(sum.DropHeld(), 2 * kLength);
  EXPECT_EQ(sum.DropHeld(), 0);
  sum.Restart();
  // Nothing of the dropped parts comes back.
  for (int r = 0; r < kWorkers; ++r) sum.Add(r, Pieces(parts[r]).span(), none);
  EXPECT_TRUE(BitEqual(sum.values(), InRankOrder(parts, none)));
}

}  // namespace
}  // namespace ps::server
