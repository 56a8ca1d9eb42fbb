#include "server/worker_ledger.h"

#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "absl/time/time.h"
#include "server/sessions.h"

namespace ps::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(WorkerLedgerTest, RanksAreHeldByIdsWithTheirOwnSessions) {
  WorkerLedger ledger(2);
  ledger.LayOut(3, 1);
  SessionIssuer issuer;
  const std::string session = issuer.Issue();
  ledger.Admit(1, "b", session, false, 10);
  EXPECT_FALSE(ledger.Held(0));
  EXPECT_TRUE(ledger.Held(1));
  EXPECT_FALSE(ledger.Held(2));
  EXPECT_FALSE(ledger.Held(-1));
  EXPECT_TRUE(ledger.CheckHeld(1, "push from").ok());
  EXPECT_EQ(ledger.CheckHeld(0, "push from").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ledger.CheckHeld(2, "push from").message(), "push from unregistered worker rank 2");
  EXPECT_THAT(ledger.ids(), ElementsAre("", "b"));
  EXPECT_TRUE(ledger.CheckSession(1, session).ok());
  EXPECT_EQ(ledger.CheckSession(0, session).code(), absl::StatusCode::kNotFound);
  const absl::Status other = ledger.CheckSession(1, issuer.Issue());
  EXPECT_EQ(other.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(other.message(), HasSubstr("not rank 1's (worker 'b'"));
}

WorkerIdentity Unvouched(std::string proof) {
  WorkerIdentity identity;
  identity.vouched = false;
  identity.proof = std::move(proof);
  identity.liveness_timeout = absl::Seconds(10);
  return identity;
}

TEST(WorkerLedgerTest, ALiveIdIsRefusedWithItsAgeUnlessProvedOrVouched) {
  WorkerLedger ledger(2);
  ledger.LayOut(3, 1);
  const int64_t heard_ns = absl::ToInt64Nanoseconds(absl::Seconds(100));
  ledger.Admit(0, "w0", "s0", false, heard_ns, "secret-of-w0");
  const int64_t later_ns = heard_ns + absl::ToInt64Nanoseconds(absl::Milliseconds(1300));
  // A stranger naming w0 with the token only, or with a guess.
  for (const std::string& proof : {std::string(), std::string("guess")}) {
    const absl::Status refused = ledger.CheckIdentity("w0", Unvouched(proof), later_ns);
    EXPECT_EQ(refused.code(), absl::StatusCode::kAlreadyExists);
    EXPECT_THAT(refused.message(), HasSubstr("worker 'w0' is live: rank 0's holder was heard "
                                             "1.3 s ago, within the liveness timeout of 10s"));
    EXPECT_TRUE(refused.GetPayload(kLiveWorkerPayload).has_value());
  }
  // The same worker restarted, with its secret: at once.
  EXPECT_TRUE(ledger.CheckIdentity("w0", Unvouched("secret-of-w0"), later_ns).ok());
  // A certificate that names it (or a caller in this process).
  EXPECT_TRUE(ledger.CheckIdentity("w0", WorkerIdentity(), later_ns).ok());
  // An id that holds no rank.
  EXPECT_TRUE(ledger.CheckIdentity("w1", Unvouched(""), later_ns).ok());
  // Once the holder is lost (not heard for more than the timeout), anyone.
  const int64_t lost_ns = heard_ns + absl::ToInt64Nanoseconds(absl::Seconds(10)) + 1;
  EXPECT_TRUE(ledger.CheckIdentity("w0", Unvouched(""), lost_ns).ok());
  // A heartbeat makes it live again.
  ledger.Heard(0, lost_ns);
  EXPECT_EQ(ledger.CheckIdentity("w0", Unvouched(""), lost_ns + 1).code(),
            absl::StatusCode::kAlreadyExists);
}

TEST(WorkerLedgerTest, AnEmptyProofProvesNothing) {
  WorkerLedger ledger(1);
  ledger.LayOut(1, 1);
  ledger.Admit(0, "w0", "s0", false, 0);  // registered without a secret
  const absl::Status refused = ledger.CheckIdentity("w0", Unvouched(""), 5);
  EXPECT_EQ(refused.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(refused.message(), HasSubstr("carries no identity proof (the holder registered "
                                           "without one)"));
  EXPECT_EQ(ledger.CheckIdentity("w0", Unvouched("any"), 5).code(),
            absl::StatusCode::kAlreadyExists);
  // Whoever registers next replaces the secret.
  ledger.Admit(0, "w0", "s1", false, 10, "new");
  EXPECT_TRUE(ledger.CheckIdentity("w0", Unvouched("new"), 11).ok());
}

TEST(WorkerLedgerTest, ClaimsEachChunkOncePerIteration) {
  WorkerLedger ledger(2);
  ledger.LayOut(3, 1);
  ledger.Admit(0, "a", "s", false, 0);
  std::vector<bool> carried;
  EXPECT_EQ(ledger.Claim(0, 0, 8, std::vector<int64_t>{0, 2}, 5, &carried), -1);
  EXPECT_THAT(carried, ElementsAre(false, false));
  EXPECT_THAT(ledger.pushed(0, 0), ElementsAre(true, false, true));
  EXPECT_EQ(ledger.num_samples(0, 0), 8);
  // The second chunk of this message was pushed: nothing is claimed.
  EXPECT_EQ(ledger.Claim(0, 0, 8, std::vector<int64_t>{1, 2}, 6, &carried), 1);
  EXPECT_THAT(ledger.pushed(0, 0), ElementsAre(true, false, true));
  EXPECT_THAT(ledger.Unpushed(0, 0), ElementsAre(1));
  EXPECT_THAT(ledger.RanksMissing(0, {true, true}), ElementsAre(0, 1));
  EXPECT_THAT(ledger.RanksMissing(0, {true, false}), ElementsAre(0));
  EXPECT_EQ(ledger.Claim(0, 0, 8, std::vector<int64_t>{1}, 7, &carried), -1);
  EXPECT_THAT(ledger.RanksMissing(0, {true, false}), ElementsAre());
  const std::vector<WorkerProgress> progress = ledger.Progress(0);
  EXPECT_EQ(progress[0].pushed_chunks, 3);
  EXPECT_EQ(progress[0].next_iteration, 1);  // iteration 0 pushed whole
  EXPECT_EQ(progress[0].last_push_iteration, 0);
  EXPECT_EQ(progress[0].last_push_ns, 7);
  EXPECT_EQ(progress[1].next_iteration, 0);
  ledger.EndIteration(0);
  EXPECT_THAT(ledger.pushed(0, 1), ElementsAre(false, false, false));
  EXPECT_EQ(ledger.num_samples(0, 1), -1);
}

TEST(WorkerLedgerTest, ARestartedProcessCarriesWhatItsPredecessorPushed) {
  WorkerLedger ledger(1);
  ledger.LayOut(2, 1);
  ledger.Admit(0, "a", "s1", false, 0);
  std::vector<bool> carried;
  ASSERT_EQ(ledger.Claim(0, 0, 4, std::vector<int64_t>{0}, 1, &carried), -1);
  ledger.Admit(0, "a", "s2", /*carry=*/true, 2);
  EXPECT_THAT(ledger.pushed(0, 0), ElementsAre(false, false));
  EXPECT_THAT(ledger.Unpushed(0, 0), ElementsAre(1));
  // Pushed again: claimed, not to be summed twice, not counted twice.
  ASSERT_EQ(ledger.Claim(0, 0, 4, std::vector<int64_t>{0, 1}, 3, &carried), -1);
  EXPECT_THAT(carried, ElementsAre(true, false));
  EXPECT_EQ(ledger.Progress(0)[0].pushed_chunks, 2);
}

TEST(WorkerLedgerTest, ProgressFollowsIterationsAheadInTheWindow) {
  WorkerLedger ledger(1);
  ledger.LayOut(1, 3);  // ssp:2
  ledger.Admit(0, "a", "s", false, 0);
  std::vector<bool> carried;
  ASSERT_EQ(ledger.Claim(0, 0, 1, std::vector<int64_t>{0}, 1, &carried), -1);
  ASSERT_EQ(ledger.Claim(0, 1, 1, std::vector<int64_t>{0}, 2, &carried), -1);
  EXPECT_EQ(ledger.Progress(0)[0].next_iteration, 2);
  ASSERT_EQ(ledger.Claim(0, 2, 1, std::vector<int64_t>{0}, 3, &carried), -1);
  EXPECT_EQ(ledger.Progress(0)[0].next_iteration, 3);  // as far as the window goes
  EXPECT_EQ(ledger.Progress(0)[0].last_push_iteration, 2);
}

}  // namespace
}  // namespace ps::server
