#include "common/job_token.h"

#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/regular_file.h"
#include "common/status_macros.h"

namespace ps {
namespace {

// A token file is read up to this many bytes; anything longer cannot hold a
// token of at most kMaxJobTokenLength characters and some whitespace.
constexpr size_t kMaxTokenFileBytes = 64 << 10;

constexpr int kMaxRandomBytes = 512;

// The first kMaxTokenFileBytes + 1 bytes (at most) of the file at `path`.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  absl::StatusOr<int> opened = OpenRegularFile(path);
  if (!opened.ok()) {
    return absl::Status(opened.status().code(),
                        absl::StrCat("job token file \"", path, "\": ",
                                     absl::IsFailedPrecondition(opened.status())
                                         ? "not a regular file"
                                         : "cannot open"));
  }
  const int fd = *opened;
  std::string contents;
  char buffer[4096];
  while (contents.size() <= kMaxTokenFileBytes) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      ::close(fd);
      return absl::ErrnoToStatus(error, absl::StrCat("job token file \"", path, "\": cannot read"));
    }
    if (n == 0) break;
    contents.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return contents;
}

// Checks a stripped, non-empty token from `source` (a description that never
// includes the token itself).
absl::Status CheckToken(absl::string_view token, const std::string& source) {
  for (size_t i = 0; i < token.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(token[i]);
    if (c < 0x20 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": the job token's character ", i + 1, " (byte 0x", absl::Hex(c, absl::kZeroPad2),
          ") is not printable ASCII, which gRPC metadata values must be"));
    }
  }
  if (token.size() < static_cast<size_t>(kMinJobTokenLength)) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": the job token has ", token.size(),
                                                   " characters; at least ", kMinJobTokenLength,
                                                   " are needed"));
  }
  if (token.size() > static_cast<size_t>(kMaxJobTokenLength)) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": the job token is longer than ", kMaxJobTokenLength, " characters"));
  }
  return absl::OkStatus();
}

// Fills `out` from getrandom(2), or /dev/urandom on a kernel without it.
absl::Status FillRandom(unsigned char* out, size_t size) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::getrandom(out + done, size - done, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == ENOSYS) break;
    if (n < 0) return absl::ErrnoToStatus(errno, "getrandom");
    done += static_cast<size_t>(n);
  }
  if (done == size) return absl::OkStatus();
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::ErrnoToStatus(errno, "open /dev/urandom");
  while (done < size) {
    const ssize_t n = ::read(fd, out + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = n < 0 ? errno : EIO;
      ::close(fd);
      return absl::ErrnoToStatus(error, "read /dev/urandom");
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ReadJobToken(const std::string& token_file, const char* env_value) {
  std::string token;
  std::string source;
  if (!token_file.empty()) {
    PS_ASSIGN_OR_RETURN(token, ReadTokenFile(token_file));
    source = absl::StrCat("job token file \"", token_file, "\"");
    if (token.size() > kMaxTokenFileBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, " is larger than ", kMaxTokenFileBytes, " bytes"));
    }
  } else if (env_value != nullptr) {
    source = absl::StrCat("$", kJobTokenEnvVar);
    token = env_value;
  } else {
    return std::string();
  }
  absl::StripAsciiWhitespace(&token);
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, " holds an empty job token",
        token_file.empty() ? absl::StrCat(" (unset ", kJobTokenEnvVar, " to run without one)")
                           : ""));
  }
  PS_RETURN_IF_ERROR(CheckToken(token, source));
  return token;
}

bool TokensEqual(absl::string_view a, absl::string_view b) {
  // Every byte position of the longer string is visited and the differences
  // are or-ed together; the only branches depend on the lengths.
  const size_t n = a.size() > b.size() ? a.size() : b.size();
  unsigned int diff = a.size() == b.size() ? 0u : 1u;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned int>(x ^ y);
  }
  return diff == 0;
}

absl::StatusOr<std::string> RandomHexToken(int bytes) {
  if (bytes < 1 || bytes > kMaxRandomBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("RandomHexToken: bytes must be in [1, ", kMaxRandomBytes, "], not ", bytes));
  }
  std::vector<unsigned char> random(static_cast<size_t>(bytes));
  PS_RETURN_IF_ERROR(FillRandom(random.data(), random.size()));
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * random.size());
  for (unsigned char c : random) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 0xf]);
  }
  return out;
}

}  // namespace ps
