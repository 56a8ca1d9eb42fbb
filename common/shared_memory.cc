#include "common/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/job_token.h"
#include "common/status_macros.h"

namespace ps {
namespace {

constexpr int64_t kMaxDataBytes = int64_t{1} << 40;
constexpr int kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

// Closes `fd` when it goes out of scope, unless released.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) ::close(fd_);
  }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<SharedMemorySegment>> SharedMemorySegment::Create(
    size_t data_bytes) {
  if (data_bytes == 0 || data_bytes > static_cast<size_t>(kMaxDataBytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a shared memory segment of ", data_bytes, " bytes; 1 to 2^40"));
  }
  PS_ASSIGN_OR_RETURN(std::string nonce, RandomHexToken(kNonceBytes / 2));
  const int fd = ::memfd_create("ps-shared-memory", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return absl::ErrnoToStatus(errno, "memfd_create");
  FdCloser closer(fd);
  const size_t total = kHeaderBytes + data_bytes;
  if (::ftruncate(fd, static_cast<off_t>(total)) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("ftruncate of a memfd to ", total, " bytes"));
  }
  if (::fcntl(fd, F_ADD_SEALS, kSeals) != 0) return absl::ErrnoToStatus(errno, "F_ADD_SEALS");
  void* mapping = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (mapping == MAP_FAILED) {
    return absl::ErrnoToStatus(errno, absl::StrCat("mmap of ", total, " bytes"));
  }
  auto segment = std::unique_ptr<SharedMemorySegment>(
      new SharedMemorySegment(static_cast<char*>(mapping), total, static_cast<int>(::getpid())));
  segment->fd_ = closer.release();
  segment->nonce_ = std::move(nonce);
  std::memcpy(segment->mapping_, segment->nonce_.data(), kNonceBytes);
  return segment;
}

absl::StatusOr<std::unique_ptr<SharedMemorySegment>> SharedMemorySegment::Attach(
    int pid, int fd, int64_t data_bytes, absl::string_view nonce, int64_t max_data_bytes) {
  if (pid <= 0 || fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared memory announced as pid ", pid, " fd ", fd));
  }
  if (data_bytes < 1 || data_bytes > std::min(max_data_bytes, kMaxDataBytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared memory of ", data_bytes, " bytes; 1 to ", max_data_bytes, " here"));
  }
  if (nonce.size() != kNonceBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a shared memory nonce of ", nonce.size(),
                                                   " bytes; ", kNonceBytes, " expected"));
  }
  const std::string path = absl::StrCat("/proc/", pid, "/fd/", fd);
  // Only a memfd is opened: reopening whatever else an fd names (a pipe, a
  // device) could have effects of its own. The peer's fd is first taken as
  // a path handle (O_PATH: no open, no effect), checked, and then that very
  // file reopened through our own handle, so the peer cannot swap another
  // file onto its fd number between the check and the open.
  const int handle = ::open(path.c_str(), O_PATH | O_CLOEXEC);
  if (handle < 0) {
    return absl::ErrnoToStatus(errno,
                               absl::StrCat("open ", path,
                                            " (is the worker on another host, in another PID "
                                            "namespace, or another user's?)"));
  }
  FdCloser handle_closer(handle);
  const std::string own = absl::StrCat("/proc/self/fd/", handle);
  char target[64] = {};
  const ssize_t n = ::readlink(own.c_str(), target, sizeof(target) - 1);
  if (n < 0) return absl::ErrnoToStatus(errno, absl::StrCat("readlink ", path));
  if (!absl::StartsWith(absl::string_view(target, static_cast<size_t>(n)), "/memfd:")) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is not a memfd"));
  }
  const int opened = ::open(own.c_str(), O_RDWR | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (opened < 0) return absl::ErrnoToStatus(errno, absl::StrCat("open ", path));
  FdCloser closer(opened);
  struct stat st;
  if (::fstat(opened, &st) != 0) return absl::ErrnoToStatus(errno, absl::StrCat("fstat ", path));
  const int64_t total = static_cast<int64_t>(kHeaderBytes) + data_bytes;
  if (!S_ISREG(st.st_mode) || st.st_size != total) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is not a shared memory segment of ", data_bytes, " bytes"));
  }
  // Without F_SEAL_SHRINK the creator could truncate it under our mapping,
  // and our next read of it would be a SIGBUS.
  const int seals = ::fcntl(opened, F_GET_SEALS);
  if (seals < 0 || (seals & kSeals) != kSeals) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is not sealed against resizing; refusing to map it"));
  }
  void* mapping =
      ::mmap(nullptr, static_cast<size_t>(total), PROT_READ | PROT_WRITE, MAP_SHARED, opened, 0);
  if (mapping == MAP_FAILED) return absl::ErrnoToStatus(errno, absl::StrCat("mmap ", path));
  auto segment = std::unique_ptr<SharedMemorySegment>(
      new SharedMemorySegment(static_cast<char*>(mapping), static_cast<size_t>(total), pid));
  // Compared in constant time: the nonce is what proves this is the
  // announced segment.
  if (!TokensEqual(absl::string_view(segment->mapping_, kNonceBytes), nonce)) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " does not hold the announced nonce (a stale or wrong fd)"));
  }
  return segment;
}

SharedMemorySegment::~SharedMemorySegment() {
  ::munmap(mapping_, mapping_bytes_);
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace ps
