#ifndef PS_COMMON_JOB_TOKEN_H_
#define PS_COMMON_JOB_TOKEN_H_

// The job token: a shared secret every process of one training job knows, so
// a server refuses RPCs from anything that is not one of its workers. The
// client sends it as gRPC metadata (kJobTokenMetadataKey) on every call; the
// server compares it with TokensEqual. main() finds it (a --job_token_file
// flag, else the PS_JOB_TOKEN environment variable, which only main() reads)
// and passes it down with ReadJobToken; libraries never read either.
//
// A token is a secret, not an encryption: without TLS it crosses the network
// in the clear. Thread-safe: the functions keep no state.

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ps {

// The gRPC metadata key the token travels under (gRPC keys are lowercase).
inline constexpr char kJobTokenMetadataKey[] = "ps-job-token";
// The environment variable main() reads the token from.
inline constexpr char kJobTokenEnvVar[] = "PS_JOB_TOKEN";
// Bounds on a token's length, in characters. The upper one keeps it well
// inside gRPC's default 8 KiB of metadata per call.
inline constexpr int kMinJobTokenLength = 16;
inline constexpr int kMaxJobTokenLength = 1024;

// The job token: from `token_file` when that is non-empty, else from
// `env_value` (what main() read from PS_JOB_TOKEN; nullptr when it is unset).
// Leading and trailing ASCII whitespace (a file's final newline) is stripped
// from either. Returns "" when neither is given: no token, authentication off.
// Errors:
//   kNotFound, kPermissionDenied (or another errno's code): `token_file`
//     cannot be opened or read; the message names it.
//   kInvalidArgument: the token is empty (an empty or whitespace-only file, or
//     PS_JOB_TOKEN set to ""; unset it to run without a token), holds a
//     character outside printable ASCII (0x20-0x7E, what gRPC metadata values
//     allow; this includes an inner newline), or is shorter than
//     kMinJobTokenLength or longer than kMaxJobTokenLength characters. The
//     message names the source and never contains the token.
absl::StatusOr<std::string> ReadJobToken(const std::string& token_file, const char* env_value);

// a == b, in time that depends on the lengths only: no early exit at the
// first differing byte, so a caller guessing a token learns nothing from how
// long a refusal took.
bool TokensEqual(absl::string_view a, absl::string_view b);

// A fresh random credential: `bytes` bytes from getrandom(2) (the kernel's
// CSPRNG, /dev/urandom's source) as 2 * bytes lowercase hex characters; the
// default gives 32. For per-worker session credentials and for generating job
// tokens. Errors: kInvalidArgument for bytes outside [1, 512]; the errno's
// code if the kernel gives no randomness.
absl::StatusOr<std::string> RandomHexToken(int bytes = 16);

}  // namespace ps

#endif  // PS_COMMON_JOB_TOKEN_H_
