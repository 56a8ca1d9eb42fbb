#include "server/chunk_message.h"

#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class ChunkMessageTest : public ::testing::Test {
 protected:
  // "w" of 6 elements in chunks of 4, "b" of 2.
  ChunkLayout layout_ =
      *ChunkLayout::Make({{"w", {6}, DType::kF32}, {"b", {2}, DType::kF32}}, 4, 1 << 20);
  std::vector<float> four_ = {1, 2, 3, 4}, two_ = {5, 6};
  absl::string_view four_piece_{reinterpret_cast<const char*>(four_.data()), 16};
  absl::string_view two_piece_{reinterpret_cast<const char*>(two_.data()), 8};
  ChunkBytes Chunk(int key, int64_t chunk, const absl::string_view& piece) {
    return {key, chunk, absl::MakeConstSpan(&piece, 1)};
  }
  std::vector<bool> none_ = std::vector<bool>(3, false);
};

TEST_F(ChunkMessageTest, GivesEachChunksGlobalIndex) {
  std::vector<int64_t> global;
  const std::vector<ChunkBytes> chunks = {Chunk(1, 0, two_piece_), Chunk(0, 0, four_piece_),
                                          Chunk(0, 1, two_piece_)};
  ASSERT_TRUE(CheckChunkShapes(layout_, chunks, none_, "pushed", &global).ok());
  EXPECT_THAT(global, ElementsAre(2, 0, 1));
  EXPECT_TRUE(CheckChunkValues(layout_, chunks, chunks.size()).ok());
}

TEST_F(ChunkMessageTest, NamesTheFirstChunkThatFailsAndStopsThere) {
  std::vector<int64_t> global;
  const std::vector<ChunkBytes> out_of_range = {Chunk(0, 0, four_piece_), Chunk(0, 2, two_piece_)};
  const absl::Status range = CheckChunkShapes(layout_, out_of_range, none_, "pushed", &global);
  EXPECT_EQ(range.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(global, ElementsAre(0));
  global.clear();
  const std::vector<ChunkBytes> short_chunk = {Chunk(0, 0, two_piece_)};
  EXPECT_THAT(CheckChunkShapes(layout_, short_chunk, none_, "pushed", &global).message(),
              HasSubstr("chunk 0 of 'w' needs 4 elements, got 2"));
  const absl::string_view odd(four_piece_.data(), 7);
  const std::vector<ChunkBytes> odd_bytes = {Chunk(1, 0, odd)};
  EXPECT_THAT(CheckChunkShapes(layout_, odd_bytes, none_, "pushed", &global).message(),
              HasSubstr("needs 2 elements, got 7 bytes"));
}

TEST_F(ChunkMessageTest, RefusesARepeatWithinTheMessageOrOneAlreadyReceived) {
  std::vector<int64_t> global;
  const std::vector<ChunkBytes> twice = {Chunk(1, 0, two_piece_), Chunk(1, 0, two_piece_)};
  const absl::Status repeat = CheckChunkShapes(layout_, twice, none_, "pushed here", &global);
  EXPECT_EQ(repeat.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(repeat.message(), HasSubstr("chunk 0 of 'b' already pushed here"));
  global.clear();
  const std::vector<bool> received = {false, false, true};
  const std::vector<ChunkBytes> again = {Chunk(1, 0, two_piece_)};
  EXPECT_EQ(CheckChunkShapes(layout_, again, received, "sent", &global).code(),
            absl::StatusCode::kAlreadyExists);
  global.clear();
  EXPECT_TRUE(CheckChunkShapes(layout_, again, /*received=*/{}, "sent", &global).ok())
      << "empty: nothing received";
  global.clear();
  EXPECT_EQ(CheckChunkShapes(layout_, twice, /*received=*/{}, "sent", &global).code(),
            absl::StatusCode::kAlreadyExists)
      << "a repeat within the message still is";
}

TEST_F(ChunkMessageTest, ANonFiniteValueIsAnErrorOrUnderLossScalingAnOverflow) {
  std::vector<float> bad = {1, std::numeric_limits<float>::quiet_NaN()};
  const absl::string_view bad_piece(reinterpret_cast<const char*>(bad.data()), 8);
  const std::vector<ChunkBytes> chunks = {Chunk(0, 1, two_piece_), Chunk(0, 1, bad_piece)};
  const absl::Status refused = CheckChunkValues(layout_, chunks, 2);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("'w'"));
  // Only the first `count` chunks are read.
  EXPECT_TRUE(CheckChunkValues(layout_, chunks, 1).ok());
  std::vector<bool> overflow(2, false);
  ASSERT_TRUE(CheckChunkValues(layout_, chunks, 2, &overflow).ok());
  EXPECT_THAT(overflow, ElementsAre(false, true));
}

}  // namespace
}  // namespace ps::server
