#include "server/push_pacer.h"

#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::server {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr int64_t kModel = 1000;  // elements per iteration
const std::vector<int> kTwo = {0, 1};

PushPacer::Options Lead(int64_t elements) {
  PushPacer::Options options;
  options.max_lead_elements = elements;
  options.idle_after = absl::Milliseconds(20);
  options.max_hold = absl::Seconds(1);
  return options;
}

TEST(PushPacerTest, HoldsTheLeaderWhileTheSlowestPushesAndLetsGoWhenItCatchesUp) {
  PushPacer pacer(Lead(100), kModel);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  // Both start; rank 0 runs 150 elements ahead while rank 1 pushes.
  EXPECT_FALSE(pacer.Record(1, 0, 10, kTwo, t0).held.has_value());
  EXPECT_FALSE(pacer.Record(0, 0, 100, kTwo, t0).held.has_value());  // lead 90
  PushPacer::Decision ahead = pacer.Record(0, 0, 60, kTwo, t0 + absl::Milliseconds(1));
  ASSERT_TRUE(ahead.held.has_value());  // lead 150 > 100
  EXPECT_EQ(pacer.held(), 1);
  // The slowest's own pushes are never held, and the one that brings it
  // within the lead lets the leader's reply go.
  PushPacer::Decision behind = pacer.Record(1, 0, 30, kTwo, t0 + absl::Milliseconds(2));
  EXPECT_FALSE(behind.held.has_value());
  EXPECT_THAT(behind.released, IsEmpty());  // lead 120 still
  behind = pacer.Record(1, 0, 30, kTwo, t0 + absl::Milliseconds(3));
  EXPECT_FALSE(behind.held.has_value());
  EXPECT_THAT(behind.released, ElementsAre(*ahead.held));  // lead 90
  EXPECT_EQ(pacer.held(), 0);
  EXPECT_EQ(pacer.next_due(), absl::InfiniteFuture());
}

// Progress across an iteration's end is counted in the model's elements,
// also for a pacer built before the model was known: rank 0, one element
// into iteration 1, is 3 ahead of rank 1 with 6 of iteration 0's 8 in.
// Counted as if an iteration were one element, rank 0 would look 4 behind.
TEST(PushPacerTest, ASizeGivenLaterCountsProgressAcrossIterations) {
  PushPacer pacer(Lead(2), /*elements_per_iteration=*/0);
  pacer.set_elements_per_iteration(8);
  pacer.set_elements_per_iteration(1000);  // the first size stays
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  EXPECT_FALSE(pacer.Record(1, 0, 6, kTwo, t0).held.has_value());
  EXPECT_FALSE(pacer.Record(0, 0, 8, kTwo, t0).held.has_value());  // lead 2
  const PushPacer::Decision ahead = pacer.Record(0, 1, 1, kTwo, t0 + absl::Milliseconds(1));
  ASSERT_TRUE(ahead.held.has_value());  // 9 against 6
  // Rank 1's last two elements bring it within the lead (and end iteration 0).
  EXPECT_THAT(pacer.Record(1, 0, 2, kTwo, t0 + absl::Milliseconds(2)).released,
              ElementsAre(*ahead.held));
}

TEST(PushPacerTest, NeverHoldsForASlowestThatIsNotPushing) {
  PushPacer pacer(Lead(100), kModel);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  // Rank 1 has not pushed yet (still in its forward pass): rank 0 uses the
  // idle link as far ahead as it likes.
  for (int i = 0; i < 5; ++i) {
    EXPECT_FALSE(pacer.Record(0, 0, 100, kTwo, t0 + absl::Milliseconds(i)).held.has_value());
  }
  // Rank 1 starts pushing: now rank 0, 490 ahead, is held...
  pacer.Record(1, 0, 10, kTwo, t0 + absl::Milliseconds(10));
  PushPacer::Decision held = pacer.Record(0, 0, 100, kTwo, t0 + absl::Milliseconds(11));
  ASSERT_TRUE(held.held.has_value());
  // ... until rank 1 falls silent for idle_after (back to computing).
  EXPECT_THAT(pacer.TakeDue(t0 + absl::Milliseconds(29)), IsEmpty());
  EXPECT_EQ(pacer.next_due(), t0 + absl::Milliseconds(30));
  EXPECT_THAT(pacer.TakeDue(t0 + absl::Milliseconds(30)), ElementsAre(*held.held));
}

TEST(PushPacerTest, ProgressRunsAcrossIterations) {
  PushPacer pacer(Lead(100), kModel);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  // Rank 1 is finishing iteration 0 while rank 0 begins iteration 1: the
  // lead counts across the boundary (1050 - 980).
  pacer.Record(1, 0, 980, kTwo, t0);
  EXPECT_FALSE(pacer.Record(0, 0, 1000, kTwo, t0).held.has_value());
  EXPECT_FALSE(pacer.Record(0, 1, 50, kTwo, t0).held.has_value());
  PushPacer::Decision held = pacer.Record(0, 1, 100, kTwo, t0);  // 1150 - 980
  ASSERT_TRUE(held.held.has_value());
  EXPECT_THAT(pacer.Record(1, 0, 20, kTwo, t0).released, IsEmpty());  // 1150 - 1000
  EXPECT_THAT(pacer.Record(1, 1, 60, kTwo, t0).released, ElementsAre(*held.held));
  // A late push of an iteration the rank has left counts nowhere: rank 1
  // stays at 1060, so rank 0 at 1250 is held (at 1560 it would not be).
  EXPECT_FALSE(pacer.Record(1, 0, 500, kTwo, t0).held.has_value());
  EXPECT_TRUE(pacer.Record(0, 1, 100, kTwo, t0).held.has_value());
}

TEST(PushPacerTest, MaxHoldBoundsEveryWait) {
  PushPacer::Options options = Lead(10);
  options.max_hold = absl::Milliseconds(5);
  PushPacer pacer(options, kModel);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  pacer.Record(1, 0, 1, kTwo, t0);
  PushPacer::Decision held = pacer.Record(0, 0, 500, kTwo, t0);
  ASSERT_TRUE(held.held.has_value());
  // Rank 1 keeps pushing (it is not idle), but the reply goes at 5 ms.
  pacer.Record(1, 0, 1, kTwo, t0 + absl::Milliseconds(4));
  EXPECT_EQ(pacer.next_due(), t0 + absl::Milliseconds(5));
  EXPECT_THAT(pacer.TakeDue(t0 + absl::Milliseconds(5)), ElementsAre(*held.held));
}

TEST(PushPacerTest, OffNonMembersAndShutdown) {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  PushPacer off(Lead(0), kModel);
  off.Record(1, 0, 1, kTwo, t0);
  EXPECT_FALSE(off.Record(0, 0, 900, kTwo, t0).held.has_value());

  PushPacer pacer(Lead(10), kModel);
  pacer.Record(1, 0, 1, kTwo, t0);
  // Rank 2 is not a member of the iteration: never held.
  EXPECT_FALSE(pacer.Record(2, 0, 900, kTwo, t0).held.has_value());
  PushPacer::Decision a = pacer.Record(0, 0, 500, kTwo, t0);
  PushPacer::Decision b = pacer.Record(0, 0, 100, kTwo, t0);
  ASSERT_TRUE(a.held.has_value() && b.held.has_value());
  EXPECT_THAT(pacer.TakeAll(), ElementsAre(*a.held, *b.held));
  EXPECT_EQ(pacer.held(), 0);
}

TEST(PushPacerTest, ThreeWorkersPaceToTheSlowest) {
  PushPacer pacer(Lead(100), kModel);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  const std::vector<int> three = {0, 1, 2};
  pacer.Record(2, 0, 10, three, t0);
  pacer.Record(1, 0, 100, three, t0);  // 90 ahead of rank 2: goes
  PushPacer::Decision r0 = pacer.Record(0, 0, 200, three, t0);
  PushPacer::Decision r1 = pacer.Record(1, 0, 100, three, t0);
  ASSERT_TRUE(r0.held.has_value());
  ASSERT_TRUE(r1.held.has_value());
  // Rank 2 reaches 150: rank 1 (200) is within 100 of it, rank 0 (200) too.
  EXPECT_THAT(pacer.Record(2, 0, 140, three, t0).released, ElementsAre(*r0.held, *r1.held));
}

}  // namespace
}  // namespace ps::server
