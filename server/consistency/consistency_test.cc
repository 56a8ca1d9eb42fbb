#include "server/consistency/consistency.h"

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::server {
namespace {

using ::testing::HasSubstr;

std::shared_ptr<const Consistency> Parsed(absl::string_view text) {
  absl::StatusOr<std::shared_ptr<const Consistency>> policy = ParseConsistency(text);
  EXPECT_TRUE(policy.ok()) << policy.status();
  return policy.ok() ? *std::move(policy) : nullptr;
}

TEST(ConsistencyTest, ParsesItsNamesAndSpellsThemBack) {
  for (const char* name : {"sync", "async", "ssp:0", "ssp:2", "ssp:64"}) {
    std::shared_ptr<const Consistency> policy = Parsed(name);
    ASSERT_NE(policy, nullptr) << name;
    EXPECT_EQ(policy->Name(), name);
  }
}

TEST(ConsistencyTest, RefusesAnythingElseQuotingItAndNamingTheChoices) {
  for (const char* bad : {"", "ssp", "ssp:", "ssp:-1", "ssp:+1", "ssp:1.5", "ssp:x", "ssp:65",
                          "ssp:99999999999999999999", "SSP:1", "bsp", "sync ", "ssp: 1"}) {
    const absl::Status s = ParseConsistency(bad).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("'", bad, "'"))) << bad;
    EXPECT_THAT(s.message(), HasSubstr("ssp:S")) << bad;
  }
  EXPECT_EQ(SspConsistency(-1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SspConsistency(kMaxStaleness + 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ConsistencyTest, SyncSumsOneIterationAtATimeAndAllowsEverything) {
  std::shared_ptr<const Consistency> sync = SyncConsistency();
  EXPECT_EQ(sync->Window(), 1);
  EXPECT_FALSE(sync->AppliesEachPush());
  EXPECT_TRUE(sync->CheckNotAhead(/*iteration=*/9, /*version=*/3).ok());  // the caller's window
  EXPECT_FALSE(sync->ReplyStaleness(5, 3).has_value());
  EXPECT_TRUE(sync->CheckCanShrink().ok());
  EXPECT_TRUE(sync->SupportsLossScaling());
  EXPECT_TRUE(sync->PacesPushes());
}

TEST(ConsistencyTest, AsyncAppliesEachPushAndHasNothingToShrink) {
  std::shared_ptr<const Consistency> async = AsyncConsistency();
  EXPECT_EQ(async->Window(), 1);
  EXPECT_TRUE(async->AppliesEachPush());
  EXPECT_FALSE(async->ReplyStaleness(5, 3).has_value());  // ApplyNow counts its own
  const absl::Status shrink = async->CheckCanShrink();
  EXPECT_EQ(shrink.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(shrink.message(), HasSubstr("nothing to shrink"));
  EXPECT_FALSE(async->SupportsLossScaling());
  EXPECT_FALSE(async->PacesPushes());
}

TEST(ConsistencyTest, SspHoldsItsWindowAndSaysWhenAPushMayBeComputed) {
  std::shared_ptr<const Consistency> ssp = Parsed("ssp:2");
  ASSERT_NE(ssp, nullptr);
  EXPECT_EQ(ssp->Window(), 3);
  EXPECT_FALSE(ssp->AppliesEachPush());
  EXPECT_TRUE(ssp->CheckNotAhead(/*iteration=*/12, /*version=*/10).ok());
  const absl::Status ahead = ssp->CheckNotAhead(/*iteration=*/13, /*version=*/10);
  EXPECT_EQ(ahead.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(ahead.message(), HasSubstr("runs ahead of the ssp:2 bound"));
  EXPECT_THAT(ahead.message(), HasSubstr("has pushed iteration 10 (version 11)"));
  EXPECT_THAT(ahead.message(), HasSubstr("server is at version 10"));
  EXPECT_EQ(ssp->ReplyStaleness(/*iteration=*/7, /*based_on_version=*/5), 2);
  EXPECT_EQ(ssp->ReplyStaleness(/*iteration=*/7, /*based_on_version=*/9), 0);
  EXPECT_EQ(ssp->CheckCanShrink().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(ssp->SupportsLossScaling());
  EXPECT_FALSE(ssp->PacesPushes());
}

TEST(ConsistencyTest, SspZeroIsSyncButForItsName) {
  std::shared_ptr<const Consistency> ssp0 = Parsed("ssp:0");
  ASSERT_NE(ssp0, nullptr);
  EXPECT_EQ(ssp0->Window(), 1);
  EXPECT_TRUE(ssp0->CheckCanShrink().ok());
  EXPECT_EQ(ssp0->CheckNotAhead(/*iteration=*/4, /*version=*/3).code(),
            absl::StatusCode::kOutOfRange);
  // Loss scaling and pacing were defined for sync alone, and stay so.
  EXPECT_FALSE(ssp0->SupportsLossScaling());
  EXPECT_FALSE(ssp0->PacesPushes());
}

}  // namespace
}  // namespace ps::server
