#include "server/update_tracker.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::server {
namespace {

using ::testing::HasSubstr;

TEST(UpdateTrackerTest, AnIterationEndsWithItsLastChunkPublished) {
  UpdateTracker updates(/*now_ns=*/5);
  updates.LayOut(2, 1);
  updates.SetInitialized();
  updates.AddComplete(0, 2);
  EXPECT_EQ(updates.complete(0), 2);
  updates.MarkReady(0, 1);
  EXPECT_TRUE(updates.ready(0, 1));
  updates.StartApplying(0, 1);
  EXPECT_FALSE(updates.ready(0, 1));
  EXPECT_TRUE(updates.applying(1));
  bool skipped = false;
  EXPECT_FALSE(updates.Publish(0, 1, /*skipped_this=*/true, 7, &skipped));
  EXPECT_FALSE(updates.applying(1));
  EXPECT_EQ(updates.chunk_version(1), 1);
  EXPECT_EQ(updates.version(), 0);
  EXPECT_EQ(updates.version_ns(), 5);
  updates.StartApplying(0, 0);
  ASSERT_TRUE(updates.Publish(0, 0, false, 9, &skipped));
  EXPECT_TRUE(skipped);  // chunk 1's update was skipped
  EXPECT_EQ(updates.version(), 1);
  EXPECT_EQ(updates.version_ns(), 9);
  EXPECT_EQ(updates.complete(0), 0);  // the slot is free for the next one
  updates.StartApplying(1, 0);
  ASSERT_FALSE(updates.Publish(1, 0, false, 10, &skipped));
  updates.StartApplying(1, 1);
  ASSERT_TRUE(updates.Publish(1, 1, false, 11, &skipped));
  EXPECT_FALSE(skipped);  // reset with the slot
}

TEST(UpdateTrackerTest, PullsWaitForVersionZeroThenForTheirChunks) {
  const ChunkLayout layout =
      *ChunkLayout::Make({{"w", {6}, DType::kF32}, {"b", {2}, DType::kF32}}, 4, 1 << 20);
  const std::vector<ChunkId> w1 = {{0, 1}}, b0 = {{1, 0}}, unknown = {{7, 0}};
  UpdateTracker updates(0);
  updates.LayOut(layout.total_chunks, 1);
  EXPECT_FALSE(updates.Has(0, &layout, {}));
  EXPECT_THAT(updates.Missing(0, nullptr, w1).message(),
              HasSubstr("initial parameters are not known (no worker has registered)"));
  EXPECT_THAT(updates.Missing(0, &layout, w1).message(),
              HasSubstr("incomplete (rank 0 has not sent them all)"));
  updates.SetInitialized();
  EXPECT_TRUE(updates.Has(0, &layout, w1));
  updates.StartApplying(0, 1);
  bool skipped = false;
  updates.Publish(0, 1, false, 1, &skipped);  // chunk 1 ("w" chunk 1) at version 1
  EXPECT_TRUE(updates.Has(1, &layout, w1));
  EXPECT_FALSE(updates.Has(1, &layout, b0));
  EXPECT_TRUE(updates.Has(1, &layout, unknown));  // refused by the caller, not awaited
  EXPECT_FALSE(updates.Has(1, &layout, {}));  // the server is at 0
  EXPECT_THAT(updates.Missing(1, &layout, b0).message(),
              HasSubstr("version 1 of chunk 0 of 'b' not reached before the deadline; the chunk "
                        "is at version 0, the server at version 0"));
  EXPECT_THAT(updates.Missing(1, &layout, {}).message(),
              HasSubstr("version 1 not reached before the deadline; the server is at version 0"));
  EXPECT_TRUE(updates.Missing(1, &layout, w1).ok());
}

TEST(UpdateTrackerTest, AChunkBeingAppliedMayGoOneFurther) {
  UpdateTracker updates(0);
  updates.LayOut(3, 2);
  EXPECT_EQ(updates.ReachableVersion(), 1);
  updates.SetVersion(4);
  EXPECT_EQ(updates.ReachableVersion(), 5);
  updates.StartApplying(4, 2);
  bool skipped = false;
  updates.Publish(4, 2, false, 0, &skipped);
  updates.StartApplying(5, 2);
  EXPECT_EQ(updates.ReachableVersion(), 6);
  updates.StopApplying(2);
  EXPECT_EQ(updates.ReachableVersion(), 5);
}

TEST(UpdateTrackerTest, TheAsynchronousVersionIsTheLeastChunkVersion) {
  UpdateTracker updates(0);
  updates.LayOut(2, 1);
  updates.PublishAsync(0, 1, 1);
  updates.PublishAsync(0, 2, 2);
  EXPECT_EQ(updates.version(), 0);
  updates.PublishAsync(1, 1, 3);
  EXPECT_EQ(updates.version(), 1);
  EXPECT_EQ(updates.version_ns(), 3);
  updates.PublishAsync(1, 2, 4);
  EXPECT_EQ(updates.version(), 2);
}

}  // namespace
}  // namespace ps::server
