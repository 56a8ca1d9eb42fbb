#include "worker/shard_plan.h"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ps::worker {
namespace {

std::vector<ParamSpec> Model(const std::vector<Shape>& shapes) {
  std::vector<ParamSpec> out;
  for (size_t k = 0; k < shapes.size(); ++k) {
    out.push_back({absl::StrCat("t", k, ".weight"), shapes[k], DType::kF32});
  }
  return out;
}

ShardPlanOptions Slack(int64_t elements) {
  ShardPlanOptions options;
  options.slack_elements = elements;
  return options;
}

// Every structural promise of the header: shards tile [0, N) in order, each
// shard's pieces tile its range in flat order, every element of every
// tensor is in exactly one piece, names and shapes as stated.
void ExpectWellFormed(const std::vector<ParamSpec>& signature, int shards,
                      const ShardPlan& plan) {
  std::vector<int64_t> offsets;
  int64_t total = 0;
  for (const ParamSpec& spec : signature) {
    offsets.push_back(total);
    total += NumElements(spec.shape);
  }
  ASSERT_EQ(plan.num_parameters, total);
  ASSERT_EQ(static_cast<int>(plan.shards.size()), shards);
  std::vector<int> seen(total, 0);
  std::vector<int> empty_tensor_seen(signature.size(), 0);
  int64_t at = 0;
  for (int s = 0; s < shards; ++s) {
    const ShardPart& part = plan.shards[s];
    EXPECT_EQ(part.flat_begin, at) << "shard " << s;
    int64_t flat = part.flat_begin;
    for (const ShardPiece& piece : part.pieces) {
      ASSERT_GE(piece.key, 0);
      ASSERT_LT(piece.key, static_cast<int>(signature.size()));
      const ParamSpec& tensor = signature[piece.key];
      const int64_t n = NumElements(tensor.shape);
      EXPECT_EQ(offsets[piece.key] + piece.begin, flat) << "shard " << s << " " << piece.spec.name;
      EXPECT_LE(0, piece.begin);
      EXPECT_LE(piece.begin, piece.end);
      EXPECT_LE(piece.end, n);
      EXPECT_EQ(NumElements(piece.spec.shape), piece.end - piece.begin);
      EXPECT_EQ(piece.spec.dtype, tensor.dtype);
      if (piece.split) {
        EXPECT_EQ(piece.spec.name,
                  absl::StrCat(tensor.name, "[", piece.begin, ":", piece.end, "]"));
        EXPECT_EQ(piece.spec.shape, Shape({piece.end - piece.begin}));
        EXPECT_LT(piece.end - piece.begin, n);
      } else {
        EXPECT_EQ(piece.spec, tensor);
        EXPECT_EQ(piece.begin, 0);
        EXPECT_EQ(piece.end, n);
      }
      if (n == 0) ++empty_tensor_seen[piece.key];
      for (int64_t i = piece.begin; i < piece.end; ++i) ++seen[offsets[piece.key] + i];
      flat += piece.end - piece.begin;
    }
    EXPECT_EQ(flat, part.flat_end) << "shard " << s;
    if (part.elements() > 0) {
      EXPECT_FALSE(part.pieces.empty()) << "shard " << s;
    }
    EXPECT_EQ(part.signature().size(), part.pieces.size());
    at = part.flat_end;
  }
  EXPECT_EQ(at, total);
  for (int64_t i = 0; i < total; ++i) ASSERT_EQ(seen[i], 1) << "element " << i;
  for (size_t k = 0; k < signature.size(); ++k) {
    if (NumElements(signature[k].shape) == 0) {
      EXPECT_EQ(empty_tensor_seen[k], 1) << "tensor " << k;
    }
  }
}

// The balance bound: |load - N/S| <= 2 * slack + 1 elements, in integers.
void ExpectBalanced(const ShardPlan& plan) {
  const int64_t s_count = static_cast<int64_t>(plan.shards.size());
  for (size_t s = 0; s < plan.shards.size(); ++s) {
    const int64_t deviation = plan.shards[s].elements() * s_count - plan.num_parameters;
    EXPECT_LE(std::abs(deviation), (2 * plan.slack_elements + 1) * s_count)
        << "shard " << s << " holds " << plan.shards[s].elements() << " of "
        << plan.num_parameters << " elements, slack " << plan.slack_elements;
  }
}

TEST(ShardPlanTest, OneShardIsTheIdentity) {
  const auto model = Model({{64, 32}, {64}, {10, 64}, {10}});
  auto plan = PlanShards(model, 1);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->shards.size(), 1u);
  EXPECT_EQ(plan->shards[0].signature(), model);
  EXPECT_EQ(plan->shards[0].flat_begin, 0);
  EXPECT_EQ(plan->shards[0].flat_end, 64 * 32 + 64 + 640 + 10);
  ExpectWellFormed(model, 1, *plan);
}

TEST(ShardPlanTest, LargeTensorSplitsByElementRangeSmallOnesStayWhole) {
  // One 1M-element weight among small tensors, over 4 shards.
  const auto model = Model({{16}, {1024, 1024}, {16}, {8}});
  auto plan = PlanShards(model, 4);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectWellFormed(model, 4, *plan);
  ExpectBalanced(*plan);
  // N = 1048616, slack = N / 128 = 8192: the cuts at N/4, N/2, 3N/4 lie deep
  // inside t1 and stay; the small tensors ride with their neighbours.
  EXPECT_EQ(plan->slack_elements, 1048616 / 128);
  std::vector<std::string> names;
  for (const ShardPart& part : plan->shards) {
    for (const ShardPiece& piece : part.pieces) names.push_back(piece.spec.name);
  }
  EXPECT_EQ(names, (std::vector<std::string>{
                       "t0.weight", "t1.weight[0:262138]", "t1.weight[262138:524292]",
                       "t1.weight[524292:786446]", "t1.weight[786446:1048576]", "t2.weight",
                       "t3.weight"}));
  EXPECT_EQ(plan->shards[0].pieces.size(), 2u);
  EXPECT_EQ(plan->shards[3].pieces.size(), 3u);
}

TEST(ShardPlanTest, CutNearATensorEndMovesThereInsteadOfSplitting) {
  // Two shards, ideal cut at 1000 inside t0 = [0, 1010): 10 elements from its
  // end, within the slack (2020 / 64 = 31), so t0 stays whole on shard 0.
  const auto model = Model({{1010}, {1010}});
  auto plan = PlanShards(model, 2);
  ASSERT_TRUE(plan.ok());
  ExpectWellFormed(model, 2, *plan);
  ExpectBalanced(*plan);
  EXPECT_EQ(plan->shards[0].signature(), std::vector<ParamSpec>{model[0]});
  EXPECT_EQ(plan->shards[1].signature(), std::vector<ParamSpec>{model[1]});
  // Slack 0 cuts exactly in half: 1000 + 1020 elements split t1 at 10.
  const auto uneven = Model({{1000}, {1020}});
  auto exact = PlanShards(uneven, 2, Slack(0));
  ASSERT_TRUE(exact.ok());
  ExpectWellFormed(uneven, 2, *exact);
  EXPECT_EQ(exact->shards[0].elements(), 1010);
  EXPECT_EQ(exact->shards[1].pieces[0].spec.name, "t1.weight[10:1020]");
}

TEST(ShardPlanTest, RandomModelsAreCoveredBalancedAndDeterministic) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const int tensors = 1 + static_cast<int>(rng() % 12);
    std::vector<Shape> shapes;
    for (int k = 0; k < tensors; ++k) {
      switch (rng() % 4) {
        case 0: shapes.push_back({static_cast<int64_t>(rng() % 8)}); break;  // may be empty
        case 1: shapes.push_back({static_cast<int64_t>(1 + rng() % 300)}); break;
        case 2: shapes.push_back({static_cast<int64_t>(1 + rng() % 64),
                                  static_cast<int64_t>(1 + rng() % 300)}); break;
        default: shapes.push_back({static_cast<int64_t>(rng() % 3000)}); break;
      }
    }
    const auto model = Model(shapes);
    const int shards = 1 + static_cast<int>(rng() % 9);
    auto plan = PlanShards(model, shards);
    ASSERT_TRUE(plan.ok()) << plan.status();
    SCOPED_TRACE(absl::StrCat("trial ", trial, ": ", tensors, " tensors, ", plan->num_parameters,
                              " elements, ", shards, " shards"));
    ExpectWellFormed(model, shards, *plan);
    ExpectBalanced(*plan);
    if (plan->num_parameters >= shards) {
      for (const ShardPart& part : plan->shards) {
        EXPECT_GT(part.elements(), 0);
        // No slivers: a split piece is longer than the slack.
        for (const ShardPiece& piece : part.pieces) {
          if (piece.split) {
            EXPECT_GT(piece.end - piece.begin, plan->slack_elements);
          }
        }
      }
    }
    auto again = PlanShards(model, shards);
    ASSERT_TRUE(again.ok());
    ASSERT_EQ(again->shards.size(), plan->shards.size());
    for (size_t s = 0; s < plan->shards.size(); ++s) {
      EXPECT_EQ(again->shards[s].signature(), plan->shards[s].signature());
      EXPECT_EQ(again->shards[s].flat_begin, plan->shards[s].flat_begin);
    }
    // Exact cuts: the same promises with the tightest bound (one element).
    auto exact = PlanShards(model, shards, Slack(0));
    ASSERT_TRUE(exact.ok());
    ExpectWellFormed(model, shards, *exact);
    ExpectBalanced(*exact);
  }
}

TEST(ShardPlanTest, MoreShardsThanElementsLeavesSomeEmpty) {
  const auto model = Model({{1}, {1}, {1}});
  auto plan = PlanShards(model, 5);
  ASSERT_TRUE(plan.ok());
  ExpectWellFormed(model, 5, *plan);
  ExpectBalanced(*plan);
  int used = 0;
  for (const ShardPart& part : plan->shards) used += part.empty() ? 0 : 1;
  EXPECT_EQ(used, 3);
}

TEST(ShardPlanTest, EmptyTensorsGoWholeToTheShardAtTheirOffset) {
  const auto model = Model({{0}, {100}, {3, 0}, {100}, {0}});
  auto plan = PlanShards(model, 2);
  ASSERT_TRUE(plan.ok());
  ExpectWellFormed(model, 2, *plan);
  EXPECT_EQ(plan->shards[0].signature(), (std::vector<ParamSpec>{model[0], model[1]}));
  EXPECT_EQ(plan->shards[1].signature(),
            (std::vector<ParamSpec>{model[2], model[3], model[4]}));
  // A model with no elements at all: everything on shard 0.
  const auto nothing = Model({{0}, {0, 4}});
  auto all_on_zero = PlanShards(nothing, 3);
  ASSERT_TRUE(all_on_zero.ok());
  ExpectWellFormed(nothing, 3, *all_on_zero);
  EXPECT_EQ(all_on_zero->shards[0].signature(), nothing);
  EXPECT_TRUE(all_on_zero->shards[1].empty());
}

TEST(ShardPlanTest, RefusesNoShardsANegativeSlackAndNegativeDimensions) {
  EXPECT_EQ(PlanShards(Model({{4}}), 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanShards(Model({{4}}), 2, Slack(-2)).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto negative = PlanShards(Model({{4, -1}}), 2);
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(negative.status().message().find("t0.weight"), std::string::npos);
}

}  // namespace
}  // namespace ps::worker
