#include "server/sessions.h"

#include <set>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::server {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(SessionsTest, SessionsAreOfTheirIncarnationAndNeverRepeat) {
  SessionIssuer issuer;
  EXPECT_EQ(issuer.incarnation().size(), 16u);  // 8 bytes in hex
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    const std::string session = issuer.Issue();
    EXPECT_THAT(session, StartsWith(issuer.incarnation() + "-"));
    EXPECT_EQ(session.size(), 16u + 1 + 32u);
    EXPECT_TRUE(issuer.CheckIncarnation(session).ok());
    EXPECT_TRUE(seen.insert(session).second) << "a session issued twice";
  }
}

TEST(SessionsTest, AnotherProcesssSessionsAreAbortedNotDenied) {
  SessionIssuer ours, restarted;
  ASSERT_NE(ours.incarnation(), restarted.incarnation());
  const absl::Status old = restarted.CheckIncarnation(ours.Issue());
  EXPECT_EQ(old.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(old.message(), HasSubstr("another server process"));
  EXPECT_THAT(ours.CheckIncarnation("").message(), HasSubstr("no session credential"));
  // The prefix alone, or without its separator, is no session.
  EXPECT_FALSE(ours.CheckIncarnation(ours.incarnation()).ok());
  EXPECT_FALSE(ours.CheckIncarnation(ours.incarnation() + "x123").ok());
}

TEST(SessionsTest, MatchesOnlyTheWholeSession) {
  EXPECT_TRUE(SessionIssuer::Matches("abc-123", "abc-123"));
  EXPECT_FALSE(SessionIssuer::Matches("abc-123", "abc-124"));
  EXPECT_FALSE(SessionIssuer::Matches("abc-123", "abc-12"));
  EXPECT_FALSE(SessionIssuer::Matches("abc-123", "abc-1234"));
  EXPECT_FALSE(SessionIssuer::Matches("abc-123", ""));
}

}  // namespace
}  // namespace ps::server
