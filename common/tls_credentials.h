#ifndef PS_COMMON_TLS_CREDENTIALS_H_
#define PS_COMMON_TLS_CREDENTIALS_H_

// Transport credentials for the server and the workers' channels: plaintext,
// TLS (the client checks the server's certificate) or mutual TLS (the server
// also checks the client's). main() turns its flags into these options; the
// files are read and checked here, once, so a wrong path or a key that does
// not belong to its certificate is a clear error at start-up instead of a
// handshake that fails on every connection.
//
//   server: ServerTlsOptions{cert_file, key_file, client_ca_file}
//           -> MakeServerCredentials -> ServerBuilder::AddListeningPort
//   worker: ClientTlsOptions{ca_file, cert_file, key_file, server_name_override}
//           -> MakeChannelCredentials and AddTlsChannelArgs
//           -> grpc::CreateCustomChannel
//
// Every file is PEM. Certificate files may hold a chain (the leaf first);
// CA files may hold several CAs. Keys must be unencrypted (gRPC takes no
// passphrase). Thread-safe: the functions keep no state.
//
// Errors (each message names the option, its file and the problem):
//   kNotFound, kPermissionDenied  a file cannot be opened or read (the
//                                 errno's code: kFailedPrecondition for a
//                                 directory)
//   kInvalidArgument              a file is not PEM (no "-----BEGIN"), holds
//                                 no certificate / private key OpenSSL can
//                                 parse, is larger than 4 MiB, or the
//                                 options are inconsistent: a certificate
//                                 without its key or a key without its
//                                 certificate, a key that does not match
//                                 its certificate, a server client_ca_file
//                                 without a server certificate, a client
//                                 certificate, key or server_name_override
//                                 without a ca_file.

#include <memory>
#include <string>

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include "absl/status/statusor.h"

namespace ps {

struct ServerTlsOptions {
  // The server's certificate (chain) and its private key, PEM. Both empty: no
  // TLS, the server listens in plaintext.
  std::string cert_file;
  std::string key_file;
  // A PEM CA. Non-empty: mutual TLS; every client must present a certificate
  // signed by it (GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY).
  // Empty: clients present none.
  std::string client_ca_file;
};

struct ClientTlsOptions {
  // The CA that signed the server's certificate, PEM. Empty: no TLS (and then
  // every other field must be empty too). The system's roots are never used.
  std::string ca_file;
  // The client's certificate (chain) and key for mutual TLS: both or neither.
  std::string cert_file;
  std::string key_file;
  // The name the server's certificate must carry (a DNS or IP SAN) when it is
  // not the host in the address the channel dials, e.g. dialing 10.0.0.5
  // whose certificate says "server". Empty: the host in the address.
  std::string server_name_override;
};

// True when any field is set, i.e. the options ask for TLS; whether they are
// consistent is for MakeServerCredentials / MakeChannelCredentials to say.
bool UsesTls(const ServerTlsOptions& options);
bool UsesTls(const ClientTlsOptions& options);

// grpc::InsecureServerCredentials() when !UsesTls(options); otherwise SSL
// server credentials with the files' contents, requiring and verifying a
// client certificate when client_ca_file is set. Reads the files now; later
// changes to them are not seen. Errors: see the top of this file.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTlsOptions& options);

// grpc::InsecureChannelCredentials() when !UsesTls(options); otherwise SSL
// channel credentials trusting only ca_file, presenting cert_file/key_file
// when given. Reads the files now. Errors: see the top of this file. A
// channel also needs AddTlsChannelArgs for server_name_override.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ClientTlsOptions& options);

// Adds the channel arguments the options need to `args` (not null):
// GRPC_SSL_TARGET_NAME_OVERRIDE_ARG when server_name_override is set; nothing
// otherwise. Leaves the other arguments alone.
void AddTlsChannelArgs(const ClientTlsOptions& options, grpc::ChannelArguments* args);

}  // namespace ps

#endif  // PS_COMMON_TLS_CREDENTIALS_H_
