#include "server/registrant_identity.h"

#include <memory>

#include "common/status_macros.h"
#include "server/registration_checks.h"

namespace ps::server {

PeerCertificateNames PeerCertificateNamesOf(const grpc::ServerContextBase& context) {
  PeerCertificateNames names;
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr) return names;
  for (const grpc::string_ref& name : auth->FindPropertyValues("x509_common_name")) {
    names.common_names.emplace_back(name.data(), name.size());
  }
  for (const grpc::string_ref& name : auth->FindPropertyValues("x509_subject_alternative_name")) {
    names.alt_names.emplace_back(name.data(), name.size());
  }
  return names;
}

absl::StatusOr<WorkerIdentity> RegistrantIdentity(const std::string& worker_id,
                                                  bool client_certificates,
                                                  const PeerCertificateNames& names,
                                                  const std::string& proof,
                                                  absl::Duration liveness_timeout) {
  WorkerIdentity identity;
  if (client_certificates) {
    // The handshake checked the certificate against the client CA; which
    // worker it is for is ours to check.
    PS_RETURN_IF_ERROR(CheckCertificateNames(worker_id, names.common_names, names.alt_names));
    return identity;
  }
  identity.vouched = false;
  identity.proof = proof;
  identity.liveness_timeout = liveness_timeout;
  return identity;
}

const char* IdentityKind(const WorkerIdentity& identity) {
  if (identity.vouched) return "certificate";
  return identity.proof.empty() ? "token" : "proof";
}

}  // namespace ps::server
