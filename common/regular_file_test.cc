#include "common/regular_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <future>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/", name);
}

TEST(OpenRegularFileTest, OpensAFileAndSizesIt) {
  const std::string path = TempPath("file");
  std::FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("abc", f);
  std::fclose(f);
  struct stat st;
  auto fd = OpenRegularFile(path, &st);
  ASSERT_TRUE(fd.ok()) << fd.status();
  EXPECT_EQ(st.st_size, 3);
  char buffer[4] = {};
  EXPECT_EQ(::read(*fd, buffer, sizeof(buffer)), 3);
  ::close(*fd);
}

// A FIFO where a file belongs is refused at once: opening it for reading
// would otherwise wait for a writer forever.
TEST(OpenRegularFileTest, AFifoADirectoryAndNothingAreRefusedNamingThePath) {
  const std::string fifo = TempPath("fifo");
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto opened = std::async(std::launch::async, [&] { return OpenRegularFile(fifo); });
  ASSERT_EQ(opened.wait_for(std::chrono::seconds(10)), std::future_status::ready)
      << "the open waited for a writer";
  const absl::StatusOr<int> refused = opened.get();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr(absl::StrCat(fifo, ": not a regular file")));
  EXPECT_EQ(OpenRegularFile(::testing::TempDir()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  const absl::StatusOr<int> missing = OpenRegularFile(TempPath("nothing-here"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("nothing-here: no such file"));
}

}  // namespace
}  // namespace ps
