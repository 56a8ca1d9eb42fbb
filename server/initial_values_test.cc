#include "server/initial_values.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<ParamSpec> Signature() {
  return {{"w", {2, 2}, DType::kF32}, {"b", {2}, DType::kF32}};
}

TEST(InitialValuesTest, FlatValuesAreNamedInSignatureOrder) {
  auto named = NameFlatValues(Signature(), {1, 2, 3, 4, 5, 6});
  ASSERT_TRUE(named.ok()) << named.status();
  ASSERT_EQ(named->size(), 2u);
  EXPECT_EQ((*named)[1].name, "b");
  EXPECT_THAT((*named)[1].values, ElementsAre(5, 6));
  EXPECT_THAT(NameFlatValues(Signature(), {1, 2, 3}).status().message(),
              HasSubstr("have 3 elements but the signature needs more"));
  EXPECT_THAT(NameFlatValues(Signature(), {1, 2, 3, 4, 5, 6, 7}).status().message(),
              HasSubstr("have 7 elements but the signature needs 6"));
}

TEST(InitialValuesTest, TensorsAreLaidOutByNameIgnoringOthers) {
  auto layout = ChunkLayout::Make(Signature(), 3, 1 << 20);
  ASSERT_TRUE(layout.ok());
  // In another order, with a buffer the signature does not name.
  const std::vector<NamedTensor> tensors = {
      {"bn.running_mean", {2}, {9, 9}}, {"b", {2}, {5, 6}}, {"w", {2, 2}, {1, 2, 3, 4}}};
  EXPECT_TRUE(CheckNamedTensors(tensors).ok());
  auto flat = LayOut(tensors, *layout);
  ASSERT_TRUE(flat.ok()) << flat.status();
  EXPECT_THAT(*flat, ElementsAre(1, 2, 3, 4, 5, 6));
  EXPECT_THAT(LayOut({tensors[1]}, *layout).status().message(),
              HasSubstr("have no 'w', which the worker's model has"));
  EXPECT_THAT(LayOut({{"w", {4}, {1, 2, 3, 4}}, tensors[1]}, *layout).status().message(),
              HasSubstr("parameter 'w' has shape [4] on the server but [2, 2] on the worker"));
}

TEST(InitialValuesTest, RefusesTensorsThatDoNotFillTheirShapeOrAreNotFinite) {
  EXPECT_THAT(CheckNamedTensors({{"w", {2, 2}, {1, 2, 3}}}).message(),
              HasSubstr("initial tensor 'w' of shape"));
  EXPECT_THAT(CheckNamedTensors({{"b", {2}, {1, std::nanf("")}}}).message(),
              HasSubstr("initial tensor 'b' element 1 is not finite"));
}

TEST(InitialChunksTest, VersionZeroExistsOnceEveryChunkIsIn) {
  absl::StatusOr<ChunkLayout> layout = ChunkLayout::Make({{"w", {6}, DType::kF32}}, 2, 1 << 20);
  ASSERT_TRUE(layout.ok()) << layout.status();
  const std::vector<float> two = {1, 2};
  const absl::string_view bytes(reinterpret_cast<const char*>(two.data()), 8);
  // Whether chunk `c` may still be sent (Check names one received already).
  const auto receivable = [&](const InitialChunks& chunks, int64_t c) {
    return chunks.Check(0, *layout, {ChunkBytes{0, c, absl::MakeConstSpan(&bytes, 1)}}).ok();
  };
  InitialChunks chunks;
  chunks.Expect(3);
  EXPECT_FALSE(chunks.Receive(2));
  EXPECT_FALSE(chunks.Receive(0));
  EXPECT_FALSE(receivable(chunks, 0));
  EXPECT_TRUE(receivable(chunks, 1));
  chunks.Restart();  // rank 0 restarted: everything again
  EXPECT_TRUE(receivable(chunks, 0));
  EXPECT_FALSE(chunks.Receive(0));
  EXPECT_FALSE(chunks.Receive(1));
  EXPECT_TRUE(chunks.Receive(2));
}

TEST(InitialChunksTest, ChecksTheSenderAndEveryChunkBeforeAnyIsReceived) {
  absl::StatusOr<ChunkLayout> layout = ChunkLayout::Make({{"w", {4}, DType::kF32}}, 2, 1 << 20);
  ASSERT_TRUE(layout.ok()) << layout.status();
  const std::vector<float> good = {3, 4};
  const std::vector<float> bad = {3, std::nanf("")};
  const absl::string_view good_bytes(reinterpret_cast<const char*>(good.data()), 8);
  const absl::string_view bad_bytes(reinterpret_cast<const char*>(bad.data()), 8);
  const ChunkBytes chunk1{0, 1, absl::MakeConstSpan(&good_bytes, 1)};
  const ChunkBytes bad_chunk1{0, 1, absl::MakeConstSpan(&bad_bytes, 1)};
  InitialChunks chunks;
  chunks.Expect(layout->total_chunks);
  EXPECT_THAT(chunks.Check(1, *layout, {chunk1}).status().message(),
              HasSubstr("worker rank 1 sent initial parameters; only rank 0 is asked to"));
  EXPECT_EQ(chunks.Check(0, *layout, {bad_chunk1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::vector<int64_t>> checked = chunks.Check(0, *layout, {chunk1});
  ASSERT_TRUE(checked.ok()) << checked.status();
  EXPECT_EQ(*checked, std::vector<int64_t>{1});
  EXPECT_FALSE(chunks.Receive(1));
  EXPECT_EQ(chunks.Check(0, *layout, {chunk1}).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(chunks.Receive(0));
  EXPECT_THAT(chunks.Check(0, *layout, {}).status().message(),
              HasSubstr("the initial parameters are already complete"));
}

}  // namespace
}  // namespace ps::server
