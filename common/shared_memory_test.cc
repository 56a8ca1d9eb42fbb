#include "common/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

using ::testing::HasSubstr;

TEST(SharedMemorySegmentTest, AttachSeesTheCreatorsBytesAndBack) {
  auto created = SharedMemorySegment::Create(1 << 20);
  ASSERT_TRUE(created.ok()) << created.status();
  auto attached = SharedMemorySegment::Attach((*created)->pid(), (*created)->fd(), 1 << 20,
                                              (*created)->nonce(), 1 << 20);
  ASSERT_TRUE(attached.ok()) << attached.status();
  EXPECT_EQ((*attached)->data_bytes(), 1 << 20);
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*attached)->data()) % 64, 0u);
  std::memcpy((*created)->data() + 1000, "gradient", 8);
  EXPECT_EQ(std::string((*attached)->data() + 1000, 8), "gradient");
  std::memcpy((*attached)->data() + (1 << 20) - 6, "params", 6);
  EXPECT_EQ(std::string((*created)->data() + (1 << 20) - 6, 6), "params");
}

TEST(SharedMemorySegmentTest, AnotherProcessAttachesThroughProc) {
  int to_parent[2], to_child[2];
  ASSERT_EQ(pipe(to_parent), 0);
  ASSERT_EQ(pipe(to_child), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto segment = SharedMemorySegment::Create(4096);
    if (!segment.ok()) _exit(2);
    std::memcpy((*segment)->data(), "from the child", 14);
    const int fd = (*segment)->fd();
    if (write(to_parent[1], &fd, sizeof(fd)) != sizeof(fd)) _exit(3);
    if (write(to_parent[1], (*segment)->nonce().data(), 16) != 16) _exit(3);
    char done;
    if (read(to_child[0], &done, 1) != 1) _exit(4);
    _exit(std::string((*segment)->data() + 100, 11) == "from parent" ? 0 : 5);
  }
  int fd = -1;
  char nonce[16];
  ASSERT_EQ(read(to_parent[0], &fd, sizeof(fd)), static_cast<ssize_t>(sizeof(fd)));
  ASSERT_EQ(read(to_parent[0], nonce, 16), 16);
  auto attached = SharedMemorySegment::Attach(child, fd, 4096, std::string(nonce, 16), 4096);
  ASSERT_TRUE(attached.ok()) << attached.status();
  EXPECT_EQ(std::string((*attached)->data(), 14), "from the child");
  std::memcpy((*attached)->data() + 100, "from parent", 11);
  ASSERT_EQ(write(to_child[1], "x", 1), 1);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(SharedMemorySegmentTest, RefusesAWrongAnnouncement) {
  auto created = SharedMemorySegment::Create(8192);
  ASSERT_TRUE(created.ok()) << created.status();
  const SharedMemorySegment& s = **created;
  // The wrong nonce: a stale or guessed fd.
  auto wrong_nonce = SharedMemorySegment::Attach(s.pid(), s.fd(), 8192, "0123456789abcdef", 8192);
  EXPECT_EQ(wrong_nonce.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(wrong_nonce.status().message(), HasSubstr("nonce"));
  // The wrong size, either way.
  EXPECT_EQ(SharedMemorySegment::Attach(s.pid(), s.fd(), 4096, s.nonce(), 8192).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // Larger than the attacher allows.
  auto too_big = SharedMemorySegment::Attach(s.pid(), s.fd(), 8192, s.nonce(), 4096);
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kInvalidArgument);
  // Malformed announcements.
  EXPECT_EQ(SharedMemorySegment::Attach(0, s.fd(), 8192, s.nonce(), 8192).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SharedMemorySegment::Attach(s.pid(), -1, 8192, s.nonce(), 8192).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SharedMemorySegment::Attach(s.pid(), s.fd(), 8192, "short", 8192).status().code(),
            absl::StatusCode::kInvalidArgument);
  // An fd that is not open.
  EXPECT_FALSE(SharedMemorySegment::Attach(s.pid(), 999999, 8192, s.nonce(), 8192).ok());
  EXPECT_EQ(SharedMemorySegment::Create(0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SharedMemorySegmentTest, RefusesAnUnsealedMemfd) {
  // One its creator could shrink under the attacher's mapping (SIGBUS).
  const int fd = memfd_create("unsealed", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, SharedMemorySegment::kHeaderBytes + 4096), 0);
  ASSERT_EQ(pwrite(fd, "0123456789abcdef", 16, 0), 16);
  auto attached = SharedMemorySegment::Attach(getpid(), fd, 4096, "0123456789abcdef", 4096);
  EXPECT_EQ(attached.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(attached.status().message(), HasSubstr("sealed"));
  close(fd);
}

TEST(SharedMemorySegmentTest, OpensNothingButAMemfd) {
  // A pipe (which /proc would reopen) and a regular file are refused
  // before they are opened.
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  auto attached =
      SharedMemorySegment::Attach(getpid(), pipe_fds[0], 4096, "0123456789abcdef", 4096);
  EXPECT_EQ(attached.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(attached.status().message(), HasSubstr("not a memfd"));
  close(pipe_fds[0]);
  close(pipe_fds[1]);
  const int file = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(file, 0);
  EXPECT_EQ(
      SharedMemorySegment::Attach(getpid(), file, 4096, "0123456789abcdef", 4096).status().code(),
      absl::StatusCode::kFailedPrecondition);
  close(file);
}

TEST(SharedMemorySegmentTest, ContainsChecksRangesWithoutOverflow) {
  auto created = SharedMemorySegment::Create(100);
  ASSERT_TRUE(created.ok()) << created.status();
  const SharedMemorySegment& s = **created;
  EXPECT_TRUE(s.Contains(0, 100));
  EXPECT_TRUE(s.Contains(100, 0));
  EXPECT_FALSE(s.Contains(1, 100));
  EXPECT_FALSE(s.Contains(-1, 1));
  EXPECT_FALSE(s.Contains(50, -1));
  EXPECT_FALSE(s.Contains(INT64_MAX, INT64_MAX));
  EXPECT_FALSE(s.Contains(1, INT64_MAX));
}

}  // namespace
}  // namespace ps
