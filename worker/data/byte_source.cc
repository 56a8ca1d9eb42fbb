#include "worker/data/byte_source.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"

namespace ps::worker::data::internal {
namespace {

// Deflate cannot compress better than 1032:1 (zlib's technical details), so a
// gzip file of F bytes decompresses to at most about 1032 * F bytes.
constexpr int64_t kMaxDeflateRatio = 1032;

// Reads are done in pieces of this size, so output grows only with data.
constexpr int64_t kChunkBytes = int64_t{1} << 20;

gzFile AsGz(void* gz) { return static_cast<gzFile>(gz); }

}  // namespace

bool IsRegularFile(const std::string& path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

bool IsDirectory(const std::string& path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
}

absl::StatusOr<std::unique_ptr<ByteSource>> ByteSource::Open(const std::string& path) {
  struct stat info;
  if (stat(path.c_str(), &info) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
  }
  if (!S_ISREG(info.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read ", path, ": not a regular file",
                     S_ISDIR(info.st_mode) ? " (a directory)" : ""));
  }
  std::unique_ptr<ByteSource> source(new ByteSource(path, static_cast<int64_t>(info.st_size)));
  source->file_ = std::fopen(path.c_str(), "rb");
  if (source->file_ == nullptr) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
  }
  unsigned char magic[2] = {0, 0};
  const size_t got = std::fread(magic, 1, 2, source->file_);
  if (std::ferror(source->file_)) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot read ", path));
  }
  source->content_bytes_hint_ = source->file_bytes_;
  if (got == 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
    // The trailer's ISIZE, little-endian, in the file's last 4 bytes (a gzip
    // file has at least a 10-byte header and an 8-byte trailer).
    unsigned char isize[4];
    source->content_bytes_hint_ = -1;
    if (source->file_bytes_ >= 18 && std::fseek(source->file_, -4, SEEK_END) == 0 &&
        std::fread(isize, 1, 4, source->file_) == 4) {
      source->content_bytes_hint_ = int64_t{isize[0]} | int64_t{isize[1]} << 8 |
                                    int64_t{isize[2]} << 16 | int64_t{isize[3]} << 24;
    }
    std::fclose(source->file_);
    source->file_ = nullptr;
    gzFile gz = gzopen(path.c_str(), "rb");
    if (gz == nullptr) {
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot open gzip file ", path));
    }
    source->gz_ = gz;
    gzbuffer(gz, 1 << 17);
    // No more than the file can hold: a reader reserves what the hint says,
    // and a corrupt trailer may claim 4 GB for a 30-byte file.
    source->content_bytes_hint_ =
        std::min(source->content_bytes_hint_, source->max_content_bytes());
  } else if (std::fseek(source->file_, 0, SEEK_SET) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot seek in ", path));
  }
  return source;
}

ByteSource::~ByteSource() {
  if (file_ != nullptr) std::fclose(file_);
  if (gz_ != nullptr) gzclose_r(AsGz(gz_));
}

int64_t ByteSource::max_content_bytes() const {
  if (!gzipped()) return file_bytes_;
  if (file_bytes_ > INT64_MAX / kMaxDeflateRatio) return INT64_MAX;
  return file_bytes_ * kMaxDeflateRatio;
}

absl::Status ByteSource::GzipStatus() {
  int errnum = Z_OK;
  absl::string_view message = gzerror(AsGz(gz_), &errnum);
  // zlib prefixes its message with the path; ours already starts with it.
  absl::ConsumePrefix(&message, absl::StrCat(path_, ": "));
  switch (errnum) {
    case Z_OK:
      return absl::OkStatus();
    case Z_BUF_ERROR:  // zlib's "unexpected end of file"
      return absl::DataLossError(absl::StrCat(path_, ": truncated gzip stream (", message,
                                              " after ", bytes_read_, " decompressed bytes)"));
    case Z_ERRNO:
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot read ", path_));
    case Z_MEM_ERROR:
      return absl::ResourceExhaustedError(
          absl::StrCat(path_, ": out of memory decompressing gzip"));
    default:
      return absl::DataLossError(absl::StrCat(path_, ": corrupt gzip stream (", message,
                                              "), detected reading past decompressed byte ",
                                              bytes_read_));
  }
}

absl::StatusOr<int64_t> ByteSource::Read(void* buffer, int64_t n) {
  char* out = static_cast<char*>(buffer);
  int64_t total = 0;
  while (total < n) {
    // gzread takes an unsigned and returns an int: keep pieces well below.
    const int64_t want = std::min<int64_t>(n - total, int64_t{1} << 30);
    if (gzipped()) {
      const int r = gzread(AsGz(gz_), out + total, static_cast<unsigned>(want));
      if (r > 0) {
        bytes_read_ += r;
        total += r;
      }
      // A short read is the end of the stream or an error: a truncated stream
      // yields its data, then 0 with the error set; corruption yields -1.
      if (r < want) {
        PS_RETURN_IF_ERROR(GzipStatus());
        if (r < 0) return absl::DataLossError(absl::StrCat(path_, ": gzip read failed"));
        break;
      }
    } else {
      const int64_t got =
          static_cast<int64_t>(std::fread(out + total, 1, static_cast<size_t>(want), file_));
      bytes_read_ += got;
      total += got;
      if (got < want) {
        if (std::ferror(file_)) {
          return absl::ErrnoToStatus(errno, absl::StrCat("cannot read ", path_));
        }
        break;
      }
    }
  }
  return total;
}

absl::Status ByteSource::ReadExactly(int64_t n, absl::string_view what, std::vector<uint8_t>* out) {
  const int64_t expected_end = bytes_read_ + n;
  if (expected_end <= content_bytes_hint_) out->reserve(out->size() + n);
  int64_t remaining = n;
  while (remaining > 0) {
    const int64_t piece = std::min(remaining, kChunkBytes);
    const size_t old_size = out->size();
    out->resize(old_size + piece);
    absl::StatusOr<int64_t> got = Read(out->data() + old_size, piece);
    if (!got.ok()) {
      out->resize(old_size);
      return got.status();
    }
    out->resize(old_size + *got);
    remaining -= *got;
    if (*got < piece) {
      return absl::DataLossError(absl::StrCat(path_, ": truncated: expected ", expected_end,
                                              " bytes", gzipped() ? " (decompressed)" : "",
                                              " to hold ", what, ", found only ", bytes_read_));
    }
  }
  return absl::OkStatus();
}

absl::Status ByteSource::ReadToEnd(std::vector<uint8_t>* out) {
  if (content_bytes_hint_ > bytes_read_) {
    // One byte more than the hint: the read that finds the end fits too.
    out->reserve(out->size() + (content_bytes_hint_ - bytes_read_) + 1);
  }
  while (true) {
    const size_t old_size = out->size();
    // Within the capacity while there is some, so that the vector is not
    // reallocated.
    const int64_t spare = static_cast<int64_t>(out->capacity() - old_size);
    const int64_t piece = spare > 0 ? std::min(spare, kChunkBytes) : kChunkBytes;
    out->resize(old_size + piece);
    absl::StatusOr<int64_t> got = Read(out->data() + old_size, piece);
    if (!got.ok()) {
      out->resize(old_size);
      return got.status();
    }
    out->resize(old_size + *got);
    if (*got < piece) return absl::OkStatus();
  }
}

absl::Status ByteSource::ExpectEnd() {
  char extra;
  const int64_t content = bytes_read_;
  absl::StatusOr<int64_t> got = Read(&extra, 1);
  if (!got.ok()) return got.status();
  if (*got == 0) return absl::OkStatus();
  if (gzipped()) {
    return absl::DataLossError(absl::StrCat(path_, ": unexpected data after the expected ", content,
                                            " bytes (decompressed)"));
  }
  return absl::DataLossError(absl::StrCat(path_, ": ", file_bytes_ - content,
                                          " unexpected trailing byte(s) after the expected ",
                                          content, " bytes"));
}

}  // namespace ps::worker::data::internal
