#include "worker/identity_file.h"

#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::worker {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

void Write(const std::string& path, const std::string& text, mode_t mode) {
  unlink(path.c_str());
  std::ofstream(path) << text;
  ASSERT_EQ(chmod(path.c_str(), mode), 0);
}

TEST(IdentityFileTest, MadeAtFirstStartPrivateAndKeptAfter) {
  const std::string path = TempPath("made.identity");
  unlink(path.c_str());
  auto first = LoadOrCreateIdentity(path);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->size(), 64u);
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);
  auto again = LoadOrCreateIdentity(path);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *first) << "a restart reads the same secret";
  // Another path, another secret.
  const std::string other_path = TempPath("other.identity");
  unlink(other_path.c_str());
  EXPECT_NE(*LoadOrCreateIdentity(other_path), *first);
}

TEST(IdentityFileTest, ProcessesStartingAtOnceShareOneSecret) {
  const std::string path = TempPath("raced.identity");
  unlink(path.c_str());
  std::vector<std::string> secrets(8);
  std::vector<std::thread> threads;
  for (std::string& secret : secrets) {
    threads.emplace_back([&path, &secret] { secret = LoadOrCreateIdentity(path).value_or(""); });
  }
  for (std::thread& t : threads) t.join();
  for (const std::string& secret : secrets) EXPECT_EQ(secret, secrets[0]);
  EXPECT_EQ(secrets[0].size(), 64u);
}

TEST(IdentityFileTest, RefusesAReadableOrMalformedFileWithoutQuotingIt) {
  const std::string path = TempPath("given.identity");
  Write(path, "  a-secret-given-by-hand-0123\n", 0600);
  EXPECT_EQ(*LoadOrCreateIdentity(path), "a-secret-given-by-hand-0123");
  Write(path, "a-secret-given-by-hand-0123\n", 0644);
  absl::Status refused = LoadOrCreateIdentity(path).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(refused.message(), HasSubstr("has mode 0644"));
  EXPECT_THAT(refused.message(), HasSubstr("chmod 600"));
  EXPECT_THAT(refused.message(), Not(HasSubstr("a-secret")));
  Write(path, "short\n", 0600);
  EXPECT_EQ(LoadOrCreateIdentity(path).status().code(), absl::StatusCode::kInvalidArgument);
  Write(path, "a-secret-with\ttab-0123456789", 0600);
  refused = LoadOrCreateIdentity(path).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("outside printable ASCII"));
  // A FIFO is refused, not waited on; a missing directory is named.
  const std::string fifo = TempPath("fifo.identity");
  unlink(fifo.c_str());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(LoadOrCreateIdentity(fifo).status().code(), absl::StatusCode::kFailedPrecondition);
  refused = LoadOrCreateIdentity(TempPath("no/such/dir/w0.identity")).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(refused.message(), HasSubstr("no/such/dir/w0.identity"));
}

}  // namespace
}  // namespace ps::worker
