#include "worker/consistency.h"

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::worker {
namespace {

using ::testing::HasSubstr;

WorkerConsistency From(absl::string_view name) {
  absl::StatusOr<WorkerConsistency> c = WorkerConsistency::FromName(name);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : WorkerConsistency();
}

TEST(WorkerConsistencyTest, ReadsTheServersNamesAndSpellsThemBack) {
  for (const char* name : {"sync", "async", "ssp:0", "ssp:3"}) EXPECT_EQ(From(name).Name(), name);
  EXPECT_EQ(From(""), WorkerConsistency());  // an older server: sync
  EXPECT_EQ(WorkerConsistency().Name(), "sync");
  EXPECT_NE(From("ssp:0"), WorkerConsistency());
  EXPECT_NE(From("ssp:1"), From("ssp:2"));
}

TEST(WorkerConsistencyTest, RefusesNamesItDoesNotKnowQuotingThem) {
  absl::Status s = WorkerConsistency::FromName("bsp").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("'bsp'"));
  for (const char* bad : {"ssp:", "ssp:-1", "ssp:x"}) {
    s = WorkerConsistency::FromName(bad).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << bad;
    EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("'", bad, "'")));
  }
}

TEST(WorkerConsistencyTest, SyncPullsExactlyAndAllowsDeltas) {
  const WorkerConsistency sync;
  EXPECT_FALSE(sync.independent_steps());
  EXPECT_FALSE(sync.stale_pulls());
  EXPECT_TRUE(sync.exact_pulls());
  EXPECT_EQ(sync.OldestPullable(7), 7);
  EXPECT_FALSE(sync.reports_staleness());
  EXPECT_TRUE(sync.allows_delta_pulls());
}

TEST(WorkerConsistencyTest, AsyncTakesTheNewestAndWaitsForNobody) {
  const WorkerConsistency async = From("async");
  EXPECT_TRUE(async.independent_steps());
  EXPECT_FALSE(async.stale_pulls());
  EXPECT_FALSE(async.exact_pulls());
  EXPECT_EQ(async.OldestPullable(7), 0);
  EXPECT_TRUE(async.reports_staleness());
  EXPECT_FALSE(async.allows_delta_pulls());
}

TEST(WorkerConsistencyTest, SspPullsUpToItsBoundBehind) {
  const WorkerConsistency ssp = From("ssp:2");
  EXPECT_FALSE(ssp.independent_steps());
  EXPECT_EQ(ssp.staleness_bound(), 2);
  EXPECT_TRUE(ssp.stale_pulls());
  EXPECT_FALSE(ssp.exact_pulls());
  EXPECT_EQ(ssp.OldestPullable(7), 5);
  EXPECT_EQ(ssp.OldestPullable(1), 0);
  EXPECT_TRUE(ssp.reports_staleness());
  EXPECT_FALSE(ssp.allows_delta_pulls());
  // ssp:0 pulls as sync does, and still counts staleness.
  const WorkerConsistency ssp0 = From("ssp:0");
  EXPECT_FALSE(ssp0.stale_pulls());
  EXPECT_TRUE(ssp0.exact_pulls());
  EXPECT_EQ(ssp0.OldestPullable(7), 7);
  EXPECT_TRUE(ssp0.reports_staleness());
  EXPECT_FALSE(ssp0.allows_delta_pulls());
}

}  // namespace
}  // namespace ps::worker
