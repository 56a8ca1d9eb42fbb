#ifndef PS_COMMON_SHARED_MEMORY_H_
#define PS_COMMON_SHARED_MEMORY_H_

// A memory segment two processes on one host share, so a worker and a server
// on the same machine move tensor bytes with one memcpy on each side instead
// of two copies through the kernel's loopback TCP, gRPC's framing and its
// threads (BytePS's and ps-lite's IPC path for co-located processes; the
// wire format and RPCs stay gRPC's, only the data moves aside).
//
// The creator (a worker) makes a sealed memfd: its size can never change
// (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), so the other side's mapping
// cannot fault (SIGBUS) however the creator behaves, and a random nonce in
// its first bytes. The attacher (the server) opens it through
// /proc/<creator pid>/fd/<fd> (same user or root; nothing to clean up in
// /dev/shm when either dies) and accepts it only if it is a sealed memfd of
// exactly the announced size holding the announced nonce, so a wrong pid,
// a pid from another PID namespace, or a stale fd number is refused rather
// than mapped. Either side may write the data area at any time: a reader
// that must not see bytes change under it (a server checking values before
// summing them) copies them out first.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ps {

class SharedMemorySegment {
 public:
  // Bytes at the start of the mapping before the data area: the nonce, and
  // padding so the data area starts 64-byte aligned.
  static constexpr size_t kHeaderBytes = 64;
  static constexpr size_t kNonceBytes = 16;

  // A new segment with `data_bytes` bytes of data area, zeroed.
  // kInvalidArgument for 0 or more than 2^40 bytes; the errno's code when
  // the kernel refuses (memfd_create, ftruncate, sealing, mmap).
  static absl::StatusOr<std::unique_ptr<SharedMemorySegment>> Create(size_t data_bytes);

  // Maps the segment another process created and announced as (pid, fd,
  // data_bytes, nonce). Refused, naming the reason, when the announcement is
  // malformed or data_bytes exceeds `max_data_bytes` (kInvalidArgument),
  // when /proc/pid/fd/fd cannot be opened (the errno's code: another host,
  // another PID namespace, another user), or when what it opens is not a
  // sealed segment of that size with that nonce (kFailedPrecondition).
  static absl::StatusOr<std::unique_ptr<SharedMemorySegment>> Attach(int pid, int fd,
                                                                     int64_t data_bytes,
                                                                     absl::string_view nonce,
                                                                     int64_t max_data_bytes);

  // Unmaps (and, for the creator, closes the memfd; the memory goes when
  // both sides have let go).
  ~SharedMemorySegment();
  SharedMemorySegment(const SharedMemorySegment&) = delete;
  SharedMemorySegment& operator=(const SharedMemorySegment&) = delete;

  // The data area.
  char* data() const { return mapping_ + kHeaderBytes; }
  int64_t data_bytes() const { return static_cast<int64_t>(mapping_bytes_ - kHeaderBytes); }
  // Whether [offset, offset + bytes) lies inside the data area (no overflow
  // for any inputs).
  bool Contains(int64_t offset, int64_t bytes) const {
    return offset >= 0 && bytes >= 0 && offset <= data_bytes() && bytes <= data_bytes() - offset;
  }

  // The announcement (creator only): this process's pid, the memfd, and
  // the nonce (kNonceBytes random hex characters).
  int pid() const { return pid_; }
  int fd() const { return fd_; }
  const std::string& nonce() const { return nonce_; }

 private:
  // Owns the mapping of `mapping_bytes` (header and data area) at `mapping`.
  SharedMemorySegment(char* mapping, size_t mapping_bytes, int pid)
      : mapping_(mapping), mapping_bytes_(mapping_bytes), pid_(pid) {}

  char* const mapping_;
  const size_t mapping_bytes_;
  const int pid_;
  int fd_ = -1;  // the creator's memfd; -1 once attached (closed after mapping)
  std::string nonce_;
};

}  // namespace ps

#endif  // PS_COMMON_SHARED_MEMORY_H_
