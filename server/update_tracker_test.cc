#include "server/update_tracker.h"

#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// "w" of 6 elements in chunks of 4 (global chunks 0, 1), "b" of 2 (2).
const ChunkLayout& Layout() {
  static const ChunkLayout* layout = new ChunkLayout(
      *ChunkLayout::Make({{"w", {6}, DType::kF32}, {"b", {2}, DType::kF32}}, 4, 1 << 20));
  return *layout;
}

// Applies and publishes chunk `gc`'s update of `iteration`.
bool Apply(UpdateTracker& updates, int64_t iteration, int64_t gc, bool* skipped,
           bool skipped_this = false) {
  updates.StartApplying(iteration, gc);
  return updates.Publish(iteration, gc, skipped_this, 100 + iteration, skipped);
}

TEST(UpdateTrackerTest, AnIterationEndsWithItsLastChunkPublished) {
  UpdateTracker updates(/*now_ns=*/5);
  updates.LayOut(&Layout(), 1);
  updates.SetInitialized();
  updates.AddComplete(0, 3);
  EXPECT_EQ(updates.complete(0), 3);
  updates.MarkReady(0, 1);
  EXPECT_TRUE(updates.ready(0, 1));
  updates.StartApplying(0, 1);
  EXPECT_FALSE(updates.ready(0, 1));
  EXPECT_TRUE(updates.applying(1));
  EXPECT_EQ(updates.ReachableVersion(), 1);
  bool skipped = false;
  EXPECT_FALSE(updates.Publish(0, 1, /*skipped_this=*/true, 7, &skipped));
  EXPECT_FALSE(updates.applying(1));
  EXPECT_EQ(updates.chunk_version(1), 1);
  EXPECT_EQ(updates.version(), 0);
  EXPECT_EQ(updates.version_ns(), 5);
  EXPECT_FALSE(Apply(updates, 0, 0, &skipped));
  ASSERT_TRUE(Apply(updates, 0, 2, &skipped));
  EXPECT_TRUE(skipped);  // chunk 1's update was skipped
  EXPECT_EQ(updates.version(), 1);
  EXPECT_EQ(updates.version_ns(), 100);
  EXPECT_EQ(updates.complete(0), 0);  // the slot is free for the next one
  Apply(updates, 1, 0, &skipped);
  Apply(updates, 1, 1, &skipped);
  ASSERT_TRUE(Apply(updates, 1, 2, &skipped));
  EXPECT_FALSE(skipped);  // reset with the slot
}

TEST(UpdateTrackerTest, APullThatTimesOutNamesWhatIsMissing) {
  const std::vector<ChunkId> w1 = {{0, 1}}, b0 = {{1, 0}};
  const absl::Time past = absl::InfinitePast();
  UpdateTracker updates(0);
  EXPECT_THAT(updates.Await(0, past, w1).status().message(),
              HasSubstr("initial parameters are not known (no worker has registered)"));
  updates.LayOut(&Layout(), 1);
  EXPECT_THAT(updates.Await(0, past, w1).status().message(),
              HasSubstr("incomplete (rank 0 has not sent them all)"));
  EXPECT_FALSE(updates.Has(0, w1));
  updates.SetInitialized();
  EXPECT_THAT(*updates.Await(0, past, w1), ElementsAre(1));
  bool skipped = false;
  Apply(updates, 0, 1, &skipped);  // "w" chunk 1 at version 1
  EXPECT_TRUE(updates.Has(1, w1));
  EXPECT_FALSE(updates.Has(1, b0));
  EXPECT_FALSE(updates.Has(1, {}));  // the server is at 0
  const absl::Status chunk = updates.Await(1, past, b0).status();
  EXPECT_EQ(chunk.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(chunk.message(),
              HasSubstr("version 1 of chunk 0 of 'b' not reached before the deadline; the chunk "
                        "is at version 0, the server at version 0"));
  EXPECT_THAT(updates.Await(1, past, {}).status().message(),
              HasSubstr("version 1 not reached before the deadline; the server is at version 0"));
}

TEST(UpdateTrackerTest, AChunkThatDoesNotExistIsRefusedWithoutWaiting) {
  const std::vector<ChunkId> unknown = {{0, 2}};
  UpdateTracker updates(0);
  updates.LayOut(&Layout(), 1);
  EXPECT_TRUE(updates.Has(5, unknown));  // answered (refused) at once
  EXPECT_EQ(updates.Await(5, absl::InfiniteFuture(), unknown).status().code(),
            absl::StatusCode::kOutOfRange);
}

TEST(UpdateTrackerTest, AWaitingPullWakesWhenItsChunkIsPublished) {
  UpdateTracker updates(0);
  updates.LayOut(&Layout(), 1);
  updates.SetInitialized();
  const std::vector<ChunkId> b0 = {{1, 0}};
  std::thread publisher([&updates] {
    absl::SleepFor(absl::Milliseconds(20));
    bool skipped = false;
    Apply(updates, 0, 2, &skipped);
  });
  absl::StatusOr<std::vector<int64_t>> got = updates.Await(1, absl::InfiniteFuture(), b0);
  publisher.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(*got, ElementsAre(2));
  EXPECT_EQ(updates.version(), 0);  // chunk 2 alone moved
}

TEST(UpdateTrackerTest, AChunkBeingAppliedMayGoOneFurther) {
  UpdateTracker updates(0);
  updates.LayOut(&Layout(), 2);
  EXPECT_EQ(updates.ReachableVersion(), 1);
  updates.SetVersion(4);
  EXPECT_EQ(updates.ReachableVersion(), 5);
  bool skipped = false;
  Apply(updates, 4, 2, &skipped);
  updates.StartApplying(5, 2);
  EXPECT_EQ(updates.ReachableVersion(), 6);
  updates.StopApplying(2);
  EXPECT_EQ(updates.ReachableVersion(), 5);
}

TEST(UpdateTrackerTest, TheAsynchronousVersionIsTheLeastChunkVersion) {
  UpdateTracker updates(0);
  updates.LayOut(&Layout(), 1);
  updates.PublishAsync(0, 1, 1);
  updates.PublishAsync(1, 1, 2);
  updates.PublishAsync(0, 2, 3);
  EXPECT_EQ(updates.version(), 0);
  updates.PublishAsync(2, 1, 4);
  EXPECT_EQ(updates.version(), 1);
  EXPECT_EQ(updates.version_ns(), 4);
  updates.PublishAsync(1, 2, 5);
  updates.PublishAsync(2, 2, 6);
  EXPECT_EQ(updates.version(), 2);
}

TEST(UpdateTrackerTest, AnAsynchronousVersionPublishedLateDoesNotGoBack) {
  UpdateTracker updates(0);
  updates.LayOut(&Layout(), 1);
  // Two pushes of chunk 0 applied as versions 1 and 2, published 2 first.
  updates.PublishAsync(0, 2, 1);
  updates.PublishAsync(0, 1, 2);
  EXPECT_EQ(updates.chunk_version(0), 2);
  updates.PublishAsync(1, 1, 3);
  updates.PublishAsync(2, 1, 4);
  EXPECT_EQ(updates.version(), 1);
  EXPECT_EQ(updates.version_ns(), 4);
}

}  // namespace
}  // namespace ps::server
