#ifndef PS_WORKER_IDENTITY_FILE_H_
#define PS_WORKER_IDENTITY_FILE_H_

// A worker's identity secret (RegisterRequest.identity_proof): made at its
// first start and kept in a file of its own (the worker's --identity_file),
// so that the same worker restarted proves it is the one the server knows
// and takes its rank back at once, while a stranger holding only the job
// token cannot take a live worker's rank (docs/security.md, "Worker
// identity"). Thread-safe: keeps no state.

#include <string>

#include "absl/status/statusor.h"

namespace ps::worker {

// Bounds on a secret, in printable ASCII characters (the server refuses a
// proof over 1024 bytes).
inline constexpr int kMinIdentityLength = 16;
inline constexpr int kMaxIdentityLength = 1024;

// The secret in `path`; when nothing is there, a new one (32 random bytes
// as 64 hex characters) written there first, mode 0600, through a
// temporary file linked into place, so two processes starting at once on
// one path end up with the same secret and nobody reads a half-written
// one. Leading and trailing whitespace is stripped.
// Errors, naming the path (never the secret):
//   kPermissionDenied: the file's mode lets its group or others read or
//     write it (chmod 600 it, as ssh asks of a key);
//   kFailedPrecondition: not a regular file (a FIFO is refused, not waited
//     on);
//   kInvalidArgument: shorter than kMinIdentityLength or longer than
//     kMaxIdentityLength, or a character outside printable ASCII;
//   the errno's code when it cannot be read or made (a missing directory).
absl::StatusOr<std::string> LoadOrCreateIdentity(const std::string& path);

}  // namespace ps::worker

#endif  // PS_WORKER_IDENTITY_FILE_H_
