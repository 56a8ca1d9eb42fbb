#include "server/parameter_table.h"

#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

ParamSpec F32(const std::string& name, Shape shape) { return {name, std::move(shape), DType::kF32}; }

TEST(ChunkLayoutTest, CutsEachKeyIntoChunksInSignatureOrder) {
  // 10 elements in chunks of 4, an empty tensor (one empty chunk), 3.
  auto layout = ChunkLayout::Make({F32("w", {2, 5}), F32("e", {0}), F32("b", {3})}, 4, 1 << 20);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->num_parameters, 13);
  EXPECT_EQ(layout->total_chunks, 5);
  EXPECT_THAT(layout->key_offset, ElementsAre(0, 10, 10));
  EXPECT_THAT(layout->key_first_chunk, ElementsAre(0, 3, 4));
  EXPECT_THAT(layout->chunk_key, ElementsAre(0, 0, 0, 1, 2));
  EXPECT_THAT(layout->chunk_offset, ElementsAre(0, 4, 8, 10, 10));
  EXPECT_THAT(layout->chunk_length, ElementsAre(4, 4, 2, 0, 3));
  EXPECT_EQ(layout->GlobalChunk(0, 2), 2);
  EXPECT_EQ(layout->GlobalChunk(2, 0), 4);
  EXPECT_EQ(layout->GlobalChunk(0, 3), -1);
  EXPECT_EQ(layout->GlobalChunk(3, 0), -1);
  EXPECT_EQ(layout->GlobalChunk(-1, 0), -1);
  EXPECT_EQ(*layout->FindChunk(1, 0), 3);
  EXPECT_THAT(layout->FindChunk(0, 3).status().message(),
              HasSubstr("chunk 3 of key 'w' out of range: it has 3 chunks"));
  EXPECT_THAT(layout->FindChunk(5, 0).status().message(),
              HasSubstr("key 5 out of range: the model has 3 keys"));
}

TEST(ChunkLayoutTest, RefusesWhatCannotBeLaidOutBeforeAllocating) {
  EXPECT_EQ(ChunkLayout::Make({}, 4, 100).status().code(), absl::StatusCode::kInvalidArgument);
  auto f16 = ChunkLayout::Make({{"h", {2}, DType::kF16}}, 4, 100);
  EXPECT_THAT(f16.status().message(), HasSubstr("the server stores F32 only"));
  auto negative = ChunkLayout::Make({F32("n", {-1, 3})}, 4, 100);
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument);
  // Each tensor below the bound, their sum not.
  auto big = ChunkLayout::Make({F32("a", {60}), F32("b", {60})}, 4, 100);
  EXPECT_THAT(big.status().message(), HasSubstr("the model has 100 parameters or more"));
  // An overflowing product of dimensions is refused, not wrapped.
  auto huge = ChunkLayout::Make({F32("x", {int64_t{1} << 40, int64_t{1} << 40})}, 4, 100);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ChunkBuffersTest, AnUpdateWritesOutOfPlaceAndReusesThePreviousBuffer) {
  ChunkBuffers buffers(std::vector<float>{1, 2});
  EXPECT_EQ(buffers.previous(), nullptr);
  auto next = buffers.NextBuffer();
  (*next) = {3, 4};
  const float* first = buffers.current()->data();
  buffers.Publish(next);
  EXPECT_THAT(*buffers.current(), ElementsAre(3, 4));
  EXPECT_THAT(*buffers.previous(), ElementsAre(1, 2));
  next.reset();
  // Nobody views version 0's buffer: the next update writes into it.
  auto third = buffers.NextBuffer();
  EXPECT_EQ(third->data(), first);
  (*third) = {5, 6};
  buffers.Publish(third);
  EXPECT_THAT(*buffers.previous(), ElementsAre(3, 4));
}

TEST(ChunkBuffersTest, AViewHeldAcrossUpdatesStaysUnchanged) {
  ChunkBuffers buffers(std::vector<float>{1, 2});
  std::shared_ptr<const std::vector<float>> view = buffers.current();  // a pull's view
  auto next = buffers.NextBuffer();
  (*next) = {3, 4};
  buffers.Publish(std::move(next));
  // The previous buffer (the one viewed) is not reused: a fresh one.
  auto after = buffers.NextBuffer();
  EXPECT_NE(after.get(), view.get());
  (*after) = {5, 6};
  buffers.Publish(std::move(after));
  EXPECT_THAT(*view, ElementsAre(1, 2));
  // Writing in place copies a viewed buffer first.
  std::shared_ptr<const std::vector<float>> current_view = buffers.current();
  buffers.MutableCurrent()[0] = 9;
  EXPECT_THAT(*current_view, ElementsAre(5, 6));
  EXPECT_THAT(*buffers.current(), ElementsAre(9, 6));
  // Unviewed, it is written in place.
  const float* before = buffers.current()->data();
  buffers.MutableCurrent()[1] = 8;
  EXPECT_EQ(buffers.current()->data(), before);
}

TEST(ChunkBuffersTest, AnUnchangedUpdateMakesThePreviousParametersTheCurrentOnes) {
  ChunkBuffers buffers(std::vector<float>{1, 2});
  buffers.PublishUnchanged();
  EXPECT_EQ(buffers.previous(), buffers.current());
  // The shared buffer is never handed out as the next one.
  auto next = buffers.NextBuffer();
  EXPECT_NE(next.get(), buffers.current().get());
}

}  // namespace
}  // namespace ps::server
