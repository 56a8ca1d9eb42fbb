#include "server/sessions.h"

#include <algorithm>
#include <random>

#include <sys/random.h>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace ps::server {
namespace {

// `bytes` random bytes from the kernel's generator, in hex: unguessable.
// (std::random_device only where getrandom cannot serve, which on Linux >=
// 3.17 it always can.)
std::string RandomHex(int bytes) {
  std::string raw(bytes, '\0');
  ssize_t got = 0;
  while (got < bytes) {
    const ssize_t n = getrandom(raw.data() + got, bytes - got, 0);
    if (n <= 0) break;
    got += n;
  }
  if (got < bytes) {
    std::random_device device;
    for (char& c : raw) c = static_cast<char>(device());
  }
  return absl::BytesToHexString(raw);
}

}  // namespace

SessionIssuer::SessionIssuer() : incarnation_(RandomHex(8)) {}

std::string SessionIssuer::Issue() const { return absl::StrCat(incarnation_, "-", RandomHex(16)); }

absl::Status SessionIssuer::CheckIncarnation(absl::string_view session) const {
  const absl::string_view ours = incarnation_;
  if (session.size() <= ours.size() || !absl::StartsWith(session, ours) ||
      session[ours.size()] != '-') {
    return absl::AbortedError(absl::StrCat(
        session.empty() ? "no session credential"
                        : "a session of another server process (this one restarted since)",
        ": register again and resume from the server's version"));
  }
  return absl::OkStatus();
}

bool SessionIssuer::Matches(absl::string_view expected, absl::string_view session) {
  unsigned char diff = expected.size() != session.size();
  for (size_t i = 0; i < std::min(expected.size(), session.size()); ++i) {
    diff |= static_cast<unsigned char>(expected[i] ^ session[i]);
  }
  return diff == 0;
}

}  // namespace ps::server
