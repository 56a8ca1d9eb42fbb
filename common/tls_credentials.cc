#include "common/tls_credentials.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/regular_file.h"
#include "common/status_macros.h"

namespace ps {
namespace {

// Larger than any certificate chain or CA bundle we expect (Debian's whole
// ca-certificates.crt is about 200 KiB), small enough to refuse /dev/zero.
constexpr size_t kMaxPemFileBytes = 4 << 20;

// `option "path"`, the way every message names a file.
std::string Describe(absl::string_view side, absl::string_view option, const std::string& path) {
  return absl::StrCat("TLS ", side, " ", option, " \"", path, "\"");
}

// The contents of `path`, which must look like PEM. `what` is Describe()'s.
absl::StatusOr<std::string> ReadPemFile(const std::string& what, const std::string& path) {
  absl::StatusOr<int> opened = OpenRegularFile(path);
  if (!opened.ok()) {
    return absl::Status(opened.status().code(),
                        absl::StrCat(what, absl::IsFailedPrecondition(opened.status())
                                               ? ": not a regular file"
                                               : ": cannot open"));
  }
  const int fd = *opened;
  std::string contents;
  char buffer[16384];
  while (true) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      ::close(fd);
      return absl::ErrnoToStatus(error, absl::StrCat(what, ": cannot read"));
    }
    if (n == 0) break;
    contents.append(buffer, static_cast<size_t>(n));
    if (contents.size() > kMaxPemFileBytes) {
      ::close(fd);
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": larger than ", kMaxPemFileBytes, " bytes; not a PEM file"));
    }
  }
  ::close(fd);
  if (!absl::StrContains(contents, "-----BEGIN")) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": not PEM (no \"-----BEGIN\" line)",
                                                   contents.empty() ? "; the file is empty" : ""));
  }
  return contents;
}

// OpenSSL's queued errors for this thread as one string, clearing the queue
// (gRPC's own OpenSSL calls on this thread must not see them).
std::string TakeOpenSslErrors() {
  std::string out;
  while (const unsigned long code = ERR_get_error()) {
    char text[256];
    ERR_error_string_n(code, text, sizeof(text));
    absl::StrAppend(&out, out.empty() ? "" : "; ", text);
  }
  ERR_clear_error();
  return out.empty() ? "no OpenSSL error reported" : out;
}

// A passphrase callback that gives none, so that an encrypted key fails
// instead of OpenSSL's default prompting on the terminal.
int NoPassphrase(char* /*buf*/, int /*size*/, int /*rwflag*/, void* /*userdata*/) { return -1; }

struct BioDeleter {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
struct X509Deleter {
  void operator()(X509* cert) const { X509_free(cert); }
};
struct EvpPkeyDeleter {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
using UniqueBio = std::unique_ptr<BIO, BioDeleter>;
using UniqueX509 = std::unique_ptr<X509, X509Deleter>;
using UniqueEvpPkey = std::unique_ptr<EVP_PKEY, EvpPkeyDeleter>;

UniqueBio MemoryBio(const std::string& pem) {
  return UniqueBio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// The first certificate in `pem` (a chain's leaf).
absl::StatusOr<UniqueX509> FirstCertificate(const std::string& what, const std::string& pem) {
  UniqueBio bio = MemoryBio(pem);
  UniqueX509 cert(PEM_read_bio_X509(bio.get(), nullptr, NoPassphrase, nullptr));
  if (cert == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": holds no PEM certificate OpenSSL can parse (", TakeOpenSslErrors(), ")"));
  }
  return cert;
}

// Every certificate of a CA file must parse, and there must be one.
absl::Status CheckCaBundle(const std::string& what, const std::string& pem) {
  UniqueBio bio = MemoryBio(pem);
  int count = 0;
  while (UniqueX509 cert{PEM_read_bio_X509(bio.get(), nullptr, NoPassphrase, nullptr)}) {
    ++count;
  }
  // The loop ends on end of input (PEM_R_NO_START_LINE) or on a broken block.
  const unsigned long last = ERR_peek_last_error();
  const bool at_end =
      ERR_GET_LIB(last) == ERR_LIB_PEM && ERR_GET_REASON(last) == PEM_R_NO_START_LINE;
  std::string errors = TakeOpenSslErrors();
  if (count == 0 || !at_end) {
    return absl::InvalidArgumentError(
        absl::StrCat(what,
                     count == 0 ? ": holds no PEM certificate OpenSSL can parse ("
                                : absl::StrCat(": certificate ", count + 1, " does not parse ("),
                     errors, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<UniqueEvpPkey> PrivateKey(const std::string& what, const std::string& pem) {
  UniqueBio bio = MemoryBio(pem);
  UniqueEvpPkey key(PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassphrase, nullptr));
  if (key == nullptr) {
    const std::string errors = TakeOpenSslErrors();
    if (absl::StrContains(pem, "ENCRYPTED")) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": the private key is encrypted; gRPC needs it unencrypted (", errors, ")"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": holds no PEM private key OpenSSL can parse (", errors, ")"));
  }
  return key;
}

struct KeyCertPair {
  std::string cert_pem;
  std::string key_pem;
};

// Reads a certificate and its key, both given (checked by the caller), and
// checks that the key is the certificate's.
absl::StatusOr<KeyCertPair> LoadKeyCertPair(absl::string_view side, const std::string& cert_file,
                                            const std::string& key_file) {
  const std::string cert_what = Describe(side, "cert_file", cert_file);
  const std::string key_what = Describe(side, "key_file", key_file);
  KeyCertPair pair;
  PS_ASSIGN_OR_RETURN(pair.cert_pem, ReadPemFile(cert_what, cert_file));
  PS_ASSIGN_OR_RETURN(pair.key_pem, ReadPemFile(key_what, key_file));
  PS_ASSIGN_OR_RETURN(UniqueX509 cert, FirstCertificate(cert_what, pair.cert_pem));
  PS_ASSIGN_OR_RETURN(UniqueEvpPkey key, PrivateKey(key_what, pair.key_pem));
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(key_what, " does not match the certificate in ",
                                                   cert_what, " (", TakeOpenSslErrors(), ")"));
  }
  return pair;
}

// Both or neither of a certificate and its key.
absl::Status CheckBothOrNeither(absl::string_view side, const std::string& cert_file,
                                const std::string& key_file) {
  if (!cert_file.empty() && key_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Describe(side, "cert_file", cert_file), " is given without its key_file"));
  }
  if (cert_file.empty() && !key_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Describe(side, "key_file", key_file), " is given without its cert_file"));
  }
  return absl::OkStatus();
}

}  // namespace

bool UsesTls(const ServerTlsOptions& options) {
  return !options.cert_file.empty() || !options.key_file.empty() || !options.client_ca_file.empty();
}

bool UsesTls(const ClientTlsOptions& options) {
  return !options.ca_file.empty() || !options.cert_file.empty() || !options.key_file.empty() ||
         !options.server_name_override.empty();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTlsOptions& options) {
  if (!UsesTls(options)) return grpc::InsecureServerCredentials();
  constexpr absl::string_view kSide = "server";
  if (options.cert_file.empty() && options.key_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Describe(kSide, "client_ca_file", options.client_ca_file),
                     " is given without the server's own cert_file and key_file "
                     "(mutual TLS needs both)"));
  }
  PS_RETURN_IF_ERROR(CheckBothOrNeither(kSide, options.cert_file, options.key_file));
  PS_ASSIGN_OR_RETURN(KeyCertPair pair,
                      LoadKeyCertPair(kSide, options.cert_file, options.key_file));

  const bool mutual = !options.client_ca_file.empty();
  grpc::SslServerCredentialsOptions ssl(
      mutual ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
             : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  if (mutual) {
    const std::string what = Describe(kSide, "client_ca_file", options.client_ca_file);
    PS_ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadPemFile(what, options.client_ca_file));
    PS_RETURN_IF_ERROR(CheckCaBundle(what, ssl.pem_root_certs));
  }
  ssl.pem_key_cert_pairs.push_back({std::move(pair.key_pem), std::move(pair.cert_pem)});
  return grpc::SslServerCredentials(ssl);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ClientTlsOptions& options) {
  if (!UsesTls(options)) return grpc::InsecureChannelCredentials();
  constexpr absl::string_view kSide = "client";
  if (options.ca_file.empty()) {
    // Without a CA gRPC would trust the system's roots, which never signed a
    // cluster's certificates: refuse rather than guess.
    return absl::InvalidArgumentError(
        "TLS client: cert_file, key_file or server_name_override is given without the ca_file "
        "that signed the server's certificate");
  }
  PS_RETURN_IF_ERROR(CheckBothOrNeither(kSide, options.cert_file, options.key_file));

  grpc::SslCredentialsOptions ssl;
  const std::string ca_what = Describe(kSide, "ca_file", options.ca_file);
  PS_ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadPemFile(ca_what, options.ca_file));
  PS_RETURN_IF_ERROR(CheckCaBundle(ca_what, ssl.pem_root_certs));
  if (!options.cert_file.empty()) {
    PS_ASSIGN_OR_RETURN(KeyCertPair pair,
                        LoadKeyCertPair(kSide, options.cert_file, options.key_file));
    ssl.pem_cert_chain = std::move(pair.cert_pem);
    ssl.pem_private_key = std::move(pair.key_pem);
  }
  return grpc::SslCredentials(ssl);
}

void AddTlsChannelArgs(const ClientTlsOptions& options, grpc::ChannelArguments* args) {
  if (!options.server_name_override.empty()) {
    args->SetSslTargetNameOverride(options.server_name_override);
  }
}

}  // namespace ps
