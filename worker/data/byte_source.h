#ifndef PS_WORKER_DATA_BYTE_SOURCE_H_
#define PS_WORKER_DATA_BYTE_SOURCE_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ps::worker::data::internal {

// Sequential reader of a dataset file's content: the bytes of a raw file, or
// the decompressed bytes of a gzip file (detected by its magic 1f 8b, not by
// its name). Every error message starts with the file's path.
//
// Built for hostile input: the readers check a header's claims against
// max_content_bytes() before allocating, and ReadExactly() grows its output
// as data actually arrives, so a corrupt length costs no more memory than the
// file really holds. Where the file says how much content it holds
// (content_bytes_hint()), the output's capacity is reserved up front, so it
// is allocated once instead of doubling (a doubling vector leaves all its
// earlier blocks in the heap: 63 MB for Fashion-MNIST's 47 MB of pixels); a
// hint that lies costs address space only, since pages are written as data
// arrives.
//
// Not thread-safe. Owns its file handle, closed on destruction.
class ByteSource {
 public:
  // kNotFound if `path` does not exist, kFailedPrecondition if it is not a
  // regular file (a directory, say), the errno's code otherwise.
  static absl::StatusOr<std::unique_ptr<ByteSource>> Open(const std::string& path);

  ByteSource(const ByteSource&) = delete;
  ByteSource& operator=(const ByteSource&) = delete;
  ~ByteSource();

  const std::string& path() const { return path_; }
  bool gzipped() const { return gz_ != nullptr; }
  // Size of the file on disk, in bytes.
  int64_t file_bytes() const { return file_bytes_; }
  // An upper bound on the content's size in bytes: the file's size for a raw
  // file; for gzip, the file's size times deflate's maximum compression ratio
  // (1032:1), so that a header promising more is known to be corrupt before
  // anything is allocated for it.
  int64_t max_content_bytes() const;
  // Content bytes consumed so far.
  int64_t bytes_read() const { return bytes_read_; }
  // What the file says its content's size is, checked only against
  // max_content_bytes(): the file's size for a raw file; for gzip, the
  // size its trailer records (ISIZE: the last member's uncompressed size
  // modulo 2^32) or max_content_bytes() if that is less, -1 when it has
  // none.
  int64_t content_bytes_hint() const { return content_bytes_hint_; }

  // Reads up to `n` bytes into `buffer` and returns how many were read: fewer
  // than `n` only at the end of the content. kDataLoss for a corrupt or
  // truncated gzip stream, the errno's code for an I/O error.
  absl::StatusOr<int64_t> Read(void* buffer, int64_t n);

  // Appends exactly `n` bytes to `out`. kDataLoss if the content ends first,
  // naming `what` (e.g. "60000 x 28 x 28 bytes of pixels"), the number of
  // content bytes expected in all and the number found.
  absl::Status ReadExactly(int64_t n, absl::string_view what, std::vector<uint8_t>* out);

  // Appends the rest of the content to `out`.
  absl::Status ReadToEnd(std::vector<uint8_t>* out);

  // kDataLoss if any content is left (trailing bytes). For gzip this also
  // reaches the end of the stream, so that its CRC and length are verified.
  absl::Status ExpectEnd();

 private:
  ByteSource(std::string path, int64_t file_bytes)
      : path_(std::move(path)), file_bytes_(file_bytes) {}

  // Status for the gzip stream's error state, OK if it has none.
  absl::Status GzipStatus();

  std::string path_;
  int64_t file_bytes_ = 0;
  int64_t content_bytes_hint_ = -1;
  int64_t bytes_read_ = 0;
  std::FILE* file_ = nullptr;  // a raw file, or
  void* gz_ = nullptr;         // a gzFile (kept out of this header: zlib.h)
};

// Whether `path` names a regular file (following links) / a directory.
bool IsRegularFile(const std::string& path);
bool IsDirectory(const std::string& path);

}  // namespace ps::worker::data::internal

#endif  // PS_WORKER_DATA_BYTE_SOURCE_H_
