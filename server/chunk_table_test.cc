#include "server/chunk_table.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The bytes of `values` as one piece (`piece` must outlive the result).
F32Pieces PiecesOf(const std::vector<float>& values, absl::string_view* piece) {
  *piece = absl::string_view(reinterpret_cast<const char*>(values.data()),
                             values.size() * sizeof(float));
  return absl::MakeConstSpan(piece, 1);
}

class ChunkTableTest : public ::testing::Test {
 protected:
  // "w" of 6 elements in chunks of 4 (chunks 0 and 1), values 0..5; two
  // workers; lr 1, no momentum: an update subtracts the mean gradient.
  std::unique_ptr<ChunkTable> MakeTable(int64_t window = 1) {
    ChunkLayout layout = *ChunkLayout::Make({{"w", {6}, DType::kF32}}, 4, 1 << 20);
    OptimizerOptions options;
    options.sgd.lr = 1.f;
    optimizer_ = *CreateOptimizer(options, 6, &device_);
    return std::make_unique<ChunkTable>(std::move(layout), /*num_workers=*/2, window,
                                        std::vector<float>{0, 1, 2, 3, 4, 5}, &device_);
  }
  std::vector<float> Current(const ChunkTable& table, int64_t gc) {
    const ChunkTable::View view = *table.Take(gc, 0, false, false);
    return *view.params;
  }

  CpuDevice device_{0, 1};
  std::unique_ptr<Optimizer> optimizer_;
};

TEST_F(ChunkTableTest, TakeAllViewsChunksInRequestOrderKeptAliveAcrossAnUpdate) {
  auto table = MakeTable();
  const std::vector<int64_t> gcs = {1, 0};
  absl::StatusOr<ChunkTable::Views> views = table->TakeAll(gcs, 0, false, true);
  ASSERT_TRUE(views.ok()) << views.status();
  EXPECT_EQ(views->version, 0);
  EXPECT_EQ(views->bytes, 6 * static_cast<int64_t>(sizeof(float)));
  ASSERT_EQ(views->chunks.size(), 2u);
  EXPECT_THAT(std::vector<float>(views->chunks[0].begin(), views->chunks[0].end()),
              ElementsAre(4, 5));
  ASSERT_EQ(views->previous.size(), 2u) << "an entry per chunk";
  EXPECT_TRUE(views->previous[0].empty()) << "no version -1";
  // Chunk 0 updated while viewed: the view keeps version 0's values.
  const std::vector<float> g = {4, 4, 4, 4};
  absl::string_view p0, p1;
  table->Add(0, 0, 0, PiecesOf(g, &p0), 1, false);
  table->Add(0, 0, 1, PiecesOf(g, &p1), 1, false);
  const F32Pieces last = PiecesOf(g, &p1);
  ASSERT_TRUE(table->Apply(0, 0, 0.f, &last, *optimizer_).ok());
  EXPECT_THAT(std::vector<float>(views->chunks[1].begin(), views->chunks[1].end()),
              ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(Current(*table, 0), ElementsAre(-4, -3, -2, -1));
  // Now at versions 1 and 0: the least of them.
  absl::StatusOr<ChunkTable::Views> mixed = table->TakeAll(gcs, 0, false, false);
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  EXPECT_EQ(mixed->version, 0);
  EXPECT_TRUE(mixed->previous.empty()) << "not asked for";
}

TEST_F(ChunkTableTest, SumsBothWorkersThenAppliesTheMeanOverTheirSamples) {
  auto table = MakeTable();
  const std::vector<float> g0 = {4, 4, 4, 4}, g1 = {2, 2, 2, 2};
  absl::string_view p0, p1;
  const ChunkTable::Added first = table->Add(0, 0, /*rank=*/0, PiecesOf(g0, &p0), 1, false);
  EXPECT_FALSE(first.completes);
  const ChunkTable::Added second = table->Add(0, 0, /*rank=*/1, PiecesOf(g1, &p1), 2, false);
  ASSERT_TRUE(second.completes);
  // Rank 1's part comes in rank order, last: it is left for the update.
  ASSERT_TRUE(second.last_term_pending);
  const F32Pieces last = PiecesOf(g1, &p1);
  absl::StatusOr<bool> skipped = table->Apply(0, 0, 0.f, &last, *optimizer_);
  ASSERT_TRUE(skipped.ok()) << skipped.status();
  EXPECT_FALSE(*skipped);
  // (4 + 2) / 3 samples = 2 off each parameter; chunk 1 untouched.
  EXPECT_THAT(Current(*table, 0), ElementsAre(-2, -1, 0, 1));
  EXPECT_THAT(Current(*table, 1), ElementsAre(4, 5));
  // Exact pulls of version 0 read the previous parameters; version 2 is
  // not there.
  const ChunkTable::View exact = *table->Take(0, 0, /*exact=*/true, false);
  EXPECT_EQ(exact.version, 0);
  EXPECT_THAT(*exact.params, ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(table->Take(0, 2, true, false).status().message(),
              HasSubstr("version 2 of chunk 0 of 'w' is gone: the chunk is at version 1"));
  const ChunkTable::View delta = *table->Take(0, 1, false, /*with_previous=*/true);
  EXPECT_EQ(delta.version, 1);
  ASSERT_NE(delta.previous, nullptr);
  EXPECT_THAT(*delta.previous, ElementsAre(0, 1, 2, 3));
}

TEST_F(ChunkTableTest, AViewHeldAcrossAnUpdateStaysUnchanged) {
  auto table = MakeTable();
  const ChunkTable::View before = *table->Take(1, 0, false, false);
  const std::vector<float> g = {1, 1};
  absl::string_view p;
  table->Add(1, 0, 0, PiecesOf(g, &p), 1, false);
  // The last term pending, but its update cannot run now (say, a capture
  // holds it back): it joins the sum, and the update reads the sum alone.
  ASSERT_TRUE(table->Add(1, 0, 1, PiecesOf(g, &p), 1, false).last_term_pending);
  table->AddLastTerm(1, 0, 1, PiecesOf(g, &p));
  ASSERT_TRUE(table->Apply(1, 0, 0.f, nullptr, *optimizer_).ok());
  EXPECT_THAT(*before.params, ElementsAre(4, 5));
  EXPECT_THAT(Current(*table, 1), ElementsAre(3, 4));  // 2 / 2 samples
}

TEST_F(ChunkTableTest, AnOverflowSkipsTheUpdateAndTheVersionStillMoves) {
  auto table = MakeTable();
  const std::vector<float> g = {1, 1};
  absl::string_view p;
  table->Add(1, 0, 0, PiecesOf(g, &p), 1, /*overflow=*/true);
  EXPECT_TRUE(table->Add(1, 0, 1, PiecesOf(g, &p), 1, false).completes);
  absl::StatusOr<bool> skipped = table->Apply(1, 0, 0.f, nullptr, *optimizer_);
  ASSERT_TRUE(skipped.ok());
  EXPECT_TRUE(*skipped);
  const ChunkTable::View view = *table->Take(1, 1, /*exact=*/true, false);
  EXPECT_EQ(view.version, 1);
  EXPECT_THAT(*view.params, ElementsAre(4, 5));
  EXPECT_EQ(table->held_elements(), 0);
}

TEST_F(ChunkTableTest, AWaivedRankCompletesTheChunkAndReleasesWhatWasHeldForIt) {
  auto table = MakeTable();
  const std::vector<float> g = {3, 3};
  absl::string_view p;
  // Rank 1 first: held until rank 0's part (rank order).
  table->Add(1, 0, 1, PiecesOf(g, &p), 1, false);
  EXPECT_EQ(table->held_elements(), 2);
  EXPECT_TRUE(table->Waive(1, 0, /*rank=*/0));
  EXPECT_EQ(table->held_elements(), 0);
  EXPECT_FALSE(table->Waive(1, 0, 0));  // once
  EXPECT_FALSE(table->Waive(0, 5, 0));  // not at that iteration
  table->Add(0, 0, 1, PiecesOf(g, &p), 1, false);
  EXPECT_THAT(table->WaiveEach({1, 0}, 0, 0), ElementsAre(0)) << "chunk 1 was waived already";
  ASSERT_TRUE(table->Apply(1, 0, 0.f, nullptr, *optimizer_).ok());
  EXPECT_THAT(Current(*table, 1), ElementsAre(1, 2));
}

TEST_F(ChunkTableTest, AsynchronousUpdatesCountStalenessPerChunk) {
  auto table = MakeTable();
  const std::vector<float> g = {1, 1};
  absl::string_view p;
  absl::StatusOr<ChunkTable::Applied> a = table->ApplyNow(1, 0, 1, 2, PiecesOf(g, &p), *optimizer_);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->version, 1);
  EXPECT_EQ(a->staleness, 0);
  absl::StatusOr<ChunkTable::Applied> b = table->ApplyNow(1, 0, 1, 2, PiecesOf(g, &p), *optimizer_);
  EXPECT_EQ(b->version, 2);
  EXPECT_EQ(b->staleness, 1);  // computed from version 0, the chunk was at 1
  EXPECT_THAT(Current(*table, 1), ElementsAre(2, 3));
  // No samples: the version moves, the parameters stay.
  EXPECT_EQ(table->ApplyNow(1, 2, 0, 2, PiecesOf(g, &p), *optimizer_)->version, 3);
  EXPECT_THAT(Current(*table, 1), ElementsAre(2, 3));
}

TEST_F(ChunkTableTest, InitialValuesAndCopiesCoverTheFlatLayout) {
  ChunkLayout layout = *ChunkLayout::Make({{"w", {6}, DType::kF32}}, 4, 1 << 20);
  ChunkTable table(std::move(layout), 1, 1, /*initial=*/{}, &device_);
  const std::vector<float> values = {7, 8};
  absl::string_view p;
  table.Initialize(1, PiecesOf(values, &p));
  table.SetVersion(3);
  std::vector<float> all(6, -1.f);
  table.CopyAll(absl::MakeSpan(all));
  EXPECT_THAT(all, ElementsAre(0, 0, 0, 0, 7, 8));
  EXPECT_EQ(table.Take(0, 3, true, false)->version, 3);
  EXPECT_EQ(table.name(1), "w");
}

}  // namespace
}  // namespace ps::server
