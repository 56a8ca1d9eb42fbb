#ifndef PS_SERVER_REGISTRANT_IDENTITY_H_
#define PS_SERVER_REGISTRANT_IDENTITY_H_

// Who a registration over gRPC shows it is (docs/security.md, "Worker
// identity"): under mutual TLS its client certificate, which must name the
// worker id it registers; otherwise only the identity secret it brings.

#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/worker_ledger.h"

namespace ps::server {

// The names the peer's certificate carries (none without one, or without
// TLS): its subject's CN and its subjectAltNames.
struct PeerCertificateNames {
  std::vector<std::string> common_names;
  std::vector<std::string> alt_names;
};
PeerCertificateNames PeerCertificateNamesOf(const grpc::ServerContextBase& context);

// What a registration naming `worker_id` shows of being that worker. With
// `client_certificates` (mutual TLS) it is vouched for by `names`, which
// must include `worker_id` (kPermissionDenied naming the id and the
// certificate's names otherwise: CheckCertificateNames); else it is
// `proof`, a holder being live for `liveness_timeout` after it was heard.
absl::StatusOr<WorkerIdentity> RegistrantIdentity(const std::string& worker_id,
                                                  bool client_certificates,
                                                  const PeerCertificateNames& names,
                                                  const std::string& proof,
                                                  absl::Duration liveness_timeout);

// How the server knows the registrant, as RegisterReply.identity says it:
// "certificate", "proof" or "token".
const char* IdentityKind(const WorkerIdentity& identity);

}  // namespace ps::server

#endif  // PS_SERVER_REGISTRANT_IDENTITY_H_
