#include "worker/identity_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/job_token.h"
#include "common/regular_file.h"
#include "common/status_macros.h"

namespace ps::worker {
namespace {

absl::Status ErrnoStatus(int error, const std::string& what) {
  return absl::ErrnoToStatus(error, what);
}

// Reads the secret in `path` (kNotFound when there is none).
absl::StatusOr<std::string> ReadIdentity(const std::string& path) {
  struct stat st;
  PS_ASSIGN_OR_RETURN(const int fd, OpenRegularFile(path, &st));
  if ((st.st_mode & 077) != 0) {
    close(fd);
    return absl::PermissionDeniedError(absl::StrCat(
        "identity file ", path, " has mode ", absl::StrFormat("%04o", st.st_mode & 07777),
        ": its group or others may read or write it; chmod 600 it"));
  }
  std::string text;
  std::vector<char> buffer(4096);
  while (text.size() <= static_cast<size_t>(kMaxIdentityLength) + 64) {
    const ssize_t n = read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      close(fd);
      return ErrnoStatus(error, absl::StrCat("reading identity file ", path));
    }
    if (n == 0) break;
    text.append(buffer.data(), static_cast<size_t>(n));
  }
  close(fd);
  const std::string secret(absl::StripAsciiWhitespace(text));
  if (secret.size() < static_cast<size_t>(kMinIdentityLength) ||
      secret.size() > static_cast<size_t>(kMaxIdentityLength)) {
    return absl::InvalidArgumentError(
        absl::StrCat("identity file ", path, " holds ", secret.size(), " characters; between ",
                     kMinIdentityLength, " and ", kMaxIdentityLength, " are needed (delete it "
                     "to have a new one made)"));
  }
  for (char c : secret) {
    if (c < 0x20 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrCat(
          "identity file ", path, " holds a character outside printable ASCII"));
    }
  }
  return secret;
}

// Writes a new secret to `path` unless a file is there already.
absl::Status CreateIdentity(const std::string& path) {
  PS_ASSIGN_OR_RETURN(const std::string secret, RandomHexToken(32));
  std::string temporary = path + ".XXXXXX";
  const int fd = mkstemp(temporary.data());  // mode 0600
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("making identity file ", path));
  const std::string line = secret + "\n";
  size_t written = 0;
  int error = 0;
  while (written < line.size() && error == 0) {
    const ssize_t n = write(fd, line.data() + written, line.size() - written);
    if (n < 0 && errno != EINTR) error = errno;
    if (n > 0) written += static_cast<size_t>(n);
  }
  if (error == 0 && fsync(fd) != 0) error = errno;
  close(fd);
  // link() never replaces: a file another process made meanwhile wins.
  if (error == 0 && link(temporary.c_str(), path.c_str()) != 0 && errno != EEXIST) {
    error = errno;
  }
  unlink(temporary.c_str());
  if (error != 0) return ErrnoStatus(error, absl::StrCat("making identity file ", path));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> LoadOrCreateIdentity(const std::string& path) {
  absl::StatusOr<std::string> secret = ReadIdentity(path);
  if (secret.status().code() != absl::StatusCode::kNotFound) return secret;
  PS_RETURN_IF_ERROR(CreateIdentity(path));
  return ReadIdentity(path);
}

}  // namespace ps::worker
