#include "server/membership.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(MembershipTest, EveryRankIsAMemberUntilOneIsDropped) {
  Membership m(3);
  EXPECT_THAT(*m.MembersOf(5, 5, 1), ElementsAre(0, 1, 2));
  EXPECT_EQ(m.MembersOf(6, 5, 1).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(m.MembersOf(4, 5, 1).status().code(), absl::StatusCode::kOutOfRange);
  m.AnnounceNext();
  EXPECT_THAT(*m.MembersOf(6, 5, 1), ElementsAre(0, 1, 2));
  EXPECT_FALSE(m.AdvanceIteration()) << "nobody changed: no waivers to set";
}

TEST(MembershipTest, ADropTakesEffectAtTheFirstIterationNotAnnounced) {
  Membership m(3);
  m.AnnounceNext();  // iteration 1's members are announced with rank 1 in them
  EXPECT_TRUE(m.CheckTakesPart(1, 0).ok());
  EXPECT_FALSE(m.sits_out(1));
  ASSERT_TRUE(*m.Drop(1)) << "rank 1 took part in the current iteration";
  EXPECT_FALSE(m.participating()[1]);
  EXPECT_TRUE(m.sits_out(1));
  EXPECT_EQ(m.CheckTakesPart(1, 0).code(), absl::StatusCode::kAborted);
  EXPECT_THAT(m.CheckTakesPart(1, 0).message(),
              HasSubstr("worker rank 1 takes no part in iteration 0"));
  EXPECT_THAT(*m.MembersOf(1, 0, 1), ElementsAre(0, 1, 2)) << "announced: unchanged";
  EXPECT_TRUE(m.AdvanceIteration()) << "the drop waived parts mid-iteration";
  // Iteration 1 still has rank 1 as a member, but it does not take part.
  EXPECT_THAT(*m.MembersOf(1, 1, 1), ElementsAre(0, 1, 2));
  EXPECT_FALSE(m.participating()[1]);
  EXPECT_FALSE(m.AdvanceIteration());
  EXPECT_THAT(*m.MembersOf(2, 2, 1), ElementsAre(0, 2));
  EXPECT_FALSE(*m.Drop(1)) << "dropped already";
}

TEST(MembershipTest, TheLastMemberCannotBeDropped) {
  Membership m(2);
  ASSERT_TRUE(m.Drop(0).ok());
  auto last = m.Drop(1);
  EXPECT_EQ(last.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(last.status().message(), HasSubstr("last member"));
}

TEST(MembershipTest, ADroppedRankRejoinsAtTheNextBoundaryOrIsToldToRetry) {
  Membership m(3);
  ASSERT_TRUE(m.Drop(2).ok());
  m.AdvanceIteration();
  EXPECT_EQ(*m.Join(0, 1), 1) << "a member joins where the server is";
  m.AnnounceNext();  // iteration 2's members, without rank 2
  EXPECT_EQ(m.Join(2, 1).status().code(), absl::StatusCode::kUnavailable);
  m.AdvanceIteration();
  EXPECT_EQ(*m.Join(2, 2), 3);
  EXPECT_THAT(m.MembersAt(3, 2), ElementsAre(0, 1, 2));
  EXPECT_THAT(m.MembersAt(2, 2), ElementsAre(0, 1));
  EXPECT_TRUE(m.AdvanceIteration());
  EXPECT_TRUE(m.participating()[2]);
}

TEST(MembershipTest, UnderSspEveryIterationInFlightHasTheCurrentMembers) {
  Membership m(2);
  EXPECT_THAT(*m.MembersOf(7, 5, 3), ElementsAre(0, 1));
  EXPECT_THAT(*m.MembersOf(8, 5, 3), ElementsAre(0, 1));
  EXPECT_EQ(m.MembersOf(9, 5, 3).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace ps::server
