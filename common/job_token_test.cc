#include "common/job_token.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <set>
#include <string>

#include "common/testing/subprocess.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kToken[] = "0123456789abcdef-job-token";
constexpr char kOtherToken[] = "fedcba9876543210-env-token";

std::string WriteTmpFile(const std::string& name, const std::string& contents) {
  const std::string path = ps::testing::TestTmpPath(name);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << contents;
  return path;
}

TEST(JobTokenTest, Constants) {
  EXPECT_STREQ(kJobTokenMetadataKey, "ps-job-token");
  EXPECT_STREQ(kJobTokenEnvVar, "PS_JOB_TOKEN");
}

TEST(ReadJobTokenTest, NeitherGivenMeansNoToken) {
  auto token = ReadJobToken("", nullptr);
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "");
}

TEST(ReadJobTokenTest, FromTheEnvironment) {
  auto token = ReadJobToken("", kOtherToken);
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, kOtherToken);
}

TEST(ReadJobTokenTest, FileWinsOverTheEnvironment) {
  const std::string path = WriteTmpFile("token", kToken);
  auto token = ReadJobToken(path, kOtherToken);
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, kToken);
  // Even an unusable environment value is not looked at.
  auto despite_bad_env = ReadJobToken(path, "");
  ASSERT_TRUE(despite_bad_env.ok()) << despite_bad_env.status();
  EXPECT_EQ(*despite_bad_env, kToken);
}

TEST(ReadJobTokenTest, WhitespaceAroundIsTrimmed) {
  for (const std::string& contents :
       {std::string(kToken) + "\n", std::string(kToken) + "\r\n", std::string(kToken) + " \t\n\n",
        "  " + std::string(kToken) + "\n"}) {
    auto token = ReadJobToken(WriteTmpFile("token-ws", contents), nullptr);
    ASSERT_TRUE(token.ok()) << token.status();
    EXPECT_EQ(*token, kToken);
  }
  auto env = ReadJobToken("", " 0123456789abcdef-job-token\n");
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(*env, kToken);
}

TEST(ReadJobTokenTest, InnerSpacesArePartOfTheToken) {
  auto token = ReadJobToken("", "correct horse battery staple");
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "correct horse battery staple");
}

TEST(ReadJobTokenTest, EmptyFileIsInvalid) {
  for (const char* contents : {"", "\n", "  \t\r\n"}) {
    const std::string path = WriteTmpFile("token-empty", contents);
    auto status = ReadJobToken(path, kOtherToken).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), HasSubstr("\"" + path + "\""));
    EXPECT_THAT(status.message(), HasSubstr("empty"));
  }
}

TEST(ReadJobTokenTest, EmptyEnvironmentValueIsInvalid) {
  auto status = ReadJobToken("", "").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("PS_JOB_TOKEN"));
  EXPECT_THAT(status.message(), HasSubstr("unset"));
}

TEST(ReadJobTokenTest, NonPrintableCharactersAreInvalid) {
  for (const std::string& bad :
       {std::string("0123456789abcdef\nsecond-line"), std::string("0123456789\tabcdefgh"),
        std::string("0123456789abcdef\x7f"), std::string("0123456789abcdef\xc3\xa9"),
        std::string("0123456789abcdef\0tail", 21)}) {
    const std::string path = WriteTmpFile("token-bad", bad);
    auto status = ReadJobToken(path, nullptr).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(status.message(), HasSubstr("not printable ASCII"));
    EXPECT_THAT(status.message(), HasSubstr(path));
    // The message never carries the secret.
    EXPECT_THAT(status.message(), Not(HasSubstr("0123456789")));
  }
  auto env = ReadJobToken("", "0123456789abcdef\x01").status();
  EXPECT_EQ(env.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(env.message(), HasSubstr("$PS_JOB_TOKEN"));
}

TEST(ReadJobTokenTest, LengthBounds) {
  auto short_env = ReadJobToken("", "fifteen-chars-x").status();
  EXPECT_EQ(short_env.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(short_env.message(), HasSubstr("at least 16"));
  EXPECT_THAT(short_env.message(), Not(HasSubstr("fifteen")));
  const std::string path = WriteTmpFile("token-short", "short\n");
  auto short_file = ReadJobToken(path, nullptr).status();
  EXPECT_EQ(short_file.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(short_file.message(), HasSubstr(path));

  auto sixteen = ReadJobToken("", "sixteen-chars-xx");
  ASSERT_TRUE(sixteen.ok()) << sixteen.status();
  const std::string longest(kMaxJobTokenLength, 'a');
  EXPECT_TRUE(ReadJobToken("", longest.c_str()).ok());
  const std::string too_long(kMaxJobTokenLength + 1, 'a');
  EXPECT_EQ(ReadJobToken("", too_long.c_str()).status().code(), absl::StatusCode::kInvalidArgument);
  // A huge file is refused without reading all of it.
  const std::string huge = WriteTmpFile("token-huge", std::string(1 << 20, 'a'));
  auto huge_status = ReadJobToken(huge, nullptr).status();
  EXPECT_EQ(huge_status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(huge_status.message(), HasSubstr("larger than"));
}

TEST(ReadJobTokenTest, MissingFileIsNotFoundAndNamed) {
  const std::string path = ps::testing::TestTmpPath("no-such-token");
  auto status = ReadJobToken(path, kOtherToken).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr(path));
}

TEST(ReadJobTokenTest, UnreadableFileIsPermissionDenied) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads files whatever their mode";
  const std::string path = WriteTmpFile("token-unreadable", kToken);
  ASSERT_EQ(::chmod(path.c_str(), 0), 0);
  auto status = ReadJobToken(path, nullptr).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(status.message(), HasSubstr(path));
}

TEST(ReadJobTokenTest, DirectoryIsRefused) {
  const std::string dir = ps::testing::TestTmpPath("token-dir");
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  auto status = ReadJobToken(dir, nullptr).status();
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr(dir));
}

TEST(TokensEqualTest, ComparesWholeStrings) {
  EXPECT_TRUE(TokensEqual("", ""));
  EXPECT_TRUE(TokensEqual(kToken, kToken));
  EXPECT_FALSE(TokensEqual(kToken, kOtherToken));
  EXPECT_FALSE(TokensEqual("abc", "abd"));
  EXPECT_FALSE(TokensEqual("xbc", "abc"));
  // Prefixes, and a string padded with what the shorter one is compared
  // against past its end.
  EXPECT_FALSE(TokensEqual("abc", "abcd"));
  EXPECT_FALSE(TokensEqual("abcd", "abc"));
  EXPECT_FALSE(TokensEqual("", "a"));
  EXPECT_FALSE(TokensEqual(absl::string_view("abc\0", 4), "abc"));
  // Bytes with the high bit set.
  EXPECT_TRUE(TokensEqual("\xff\x80", "\xff\x80"));
  EXPECT_FALSE(TokensEqual("\xff\x80", "\xff\x81"));
}

TEST(RandomHexTokenTest, LengthAndCharset) {
  auto token = RandomHexToken();
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(token->size(), 32u);
  EXPECT_EQ(token->find_first_not_of("0123456789abcdef"), std::string::npos) << *token;
  for (int bytes : {1, 7, 64, 512}) {
    auto t = RandomHexToken(bytes);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->size(), 2u * bytes);
  }
  // A random token is a valid job token.
  EXPECT_TRUE(ReadJobToken("", token->c_str()).ok());
}

TEST(RandomHexTokenTest, BadSizes) {
  for (int bytes : {0, -1, 513}) {
    EXPECT_EQ(RandomHexToken(bytes).status().code(), absl::StatusCode::kInvalidArgument) << bytes;
  }
}

TEST(RandomHexTokenTest, Unique) {
  std::set<std::string> seen;
  // Every hex digit also appears across the draws (a stuck nibble would show).
  std::set<char> digits;
  for (int i = 0; i < 1000; ++i) {
    auto token = RandomHexToken();
    ASSERT_TRUE(token.ok()) << token.status();
    EXPECT_TRUE(seen.insert(*token).second) << "repeated " << *token;
    digits.insert(token->begin(), token->end());
  }
  EXPECT_EQ(digits.size(), 16u);
}

}  // namespace
}  // namespace ps
