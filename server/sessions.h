#ifndef PS_SERVER_SESSIONS_H_
#define PS_SERVER_SESSIONS_H_

// Session credentials: what a worker shows to act as its rank. Each server
// process has a random incarnation; each registration gets a new session,
// "<incarnation>-<secret>", with 16 random bytes of secret from the
// kernel's generator, so a session names its holder and dies with the
// server process that issued it (a restarted server refuses the old ones
// with kAborted: the worker registers again and resumes).

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ps::server {

class SessionIssuer {
 public:
  // A new server process's issuer, with a random incarnation.
  SessionIssuer();

  // This process's identity, the prefix of its sessions.
  const std::string& incarnation() const { return incarnation_; }
  // A new session of this incarnation (unguessable).
  std::string Issue() const;
  // kAborted unless `session` is of this incarnation (empty, or another
  // server process's: the worker must register again and resume from the
  // server's version).
  absl::Status CheckIncarnation(absl::string_view session) const;
  // Whether `session` is `expected`, compared in constant time: how far a
  // guess matches must not show.
  static bool Matches(absl::string_view expected, absl::string_view session);

 private:
  const std::string incarnation_;
};

}  // namespace ps::server

#endif  // PS_SERVER_SESSIONS_H_
