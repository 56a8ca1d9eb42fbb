#include "common/tls_credentials.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <grpc/grpc_security_constants.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/testing/subprocess.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

using ::testing::HasSubstr;

// An extra server name given to make_test_certs.sh, as a Compose service name
// would be.
constexpr char kExtraServerName[] = "ps-server";

class TlsCredentialsTest : public ::testing::Test {
 protected:
  // The certificates are made once for the whole suite (a few openssl runs).
  static void SetUpTestSuite() {
    cert_dir_ = new std::string(ps::testing::TestTmpPath("certs"));
    const std::string command = absl::StrCat(
        ps::testing::ShellQuote(ps::testing::RunfilePath("deploy/tls/make_test_certs.sh")), " ",
        ps::testing::ShellQuote(*cert_dir_), " ", kExtraServerName);
    std::string output;
    const int rc = ps::testing::RunCommand(command, &output);
    ASSERT_EQ(rc, 0) << command << "\n" << output;
    ASSERT_THAT(output, HasSubstr("worker.pem"));
  }

  static void TearDownTestSuite() {
    delete cert_dir_;
    cert_dir_ = nullptr;
  }

  static std::string Cert(const std::string& name) { return *cert_dir_ + "/" + name; }

  // Writes `contents` to a new file in the test's temporary directory.
  static std::string WriteTmpFile(const std::string& name, const std::string& contents) {
    const std::string path = ps::testing::TestTmpPath(name);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << contents;
    return path;
  }

  static ServerTlsOptions MutualServer() {
    return {Cert("server.pem"), Cert("server.key"), Cert("ca.pem")};
  }
  static ClientTlsOptions GoodWorker() {
    return {Cert("ca.pem"), Cert("worker.pem"), Cert("worker.key"), ""};
  }

  static std::string* cert_dir_;
};

std::string* TlsCredentialsTest::cert_dir_ = nullptr;

// ---------------------------------------------------------------------------
// Options and errors.

TEST_F(TlsCredentialsTest, UsesTlsWhenAnyFieldIsSet) {
  EXPECT_FALSE(UsesTls(ServerTlsOptions{}));
  EXPECT_TRUE(UsesTls(ServerTlsOptions{"c", "", ""}));
  EXPECT_TRUE(UsesTls(ServerTlsOptions{"", "k", ""}));
  EXPECT_TRUE(UsesTls(ServerTlsOptions{"", "", "ca"}));
  EXPECT_FALSE(UsesTls(ClientTlsOptions{}));
  EXPECT_TRUE(UsesTls(ClientTlsOptions{"ca", "", "", ""}));
  EXPECT_TRUE(UsesTls(ClientTlsOptions{"", "c", "", ""}));
  EXPECT_TRUE(UsesTls(ClientTlsOptions{"", "", "k", ""}));
  EXPECT_TRUE(UsesTls(ClientTlsOptions{"", "", "", "name"}));
}

TEST_F(TlsCredentialsTest, NoTlsGivesInsecureCredentials) {
  auto server = MakeServerCredentials(ServerTlsOptions{});
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_NE(*server, nullptr);
  auto client = MakeChannelCredentials(ClientTlsOptions{});
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_NE(*client, nullptr);
}

TEST_F(TlsCredentialsTest, GoodFilesGiveCredentials) {
  EXPECT_TRUE(MakeServerCredentials(MutualServer()).ok());
  EXPECT_TRUE(MakeServerCredentials({Cert("server.pem"), Cert("server.key"), ""}).ok());
  EXPECT_TRUE(MakeChannelCredentials(GoodWorker()).ok());
  EXPECT_TRUE(MakeChannelCredentials({Cert("ca.pem"), "", "", "server"}).ok());
}

TEST_F(TlsCredentialsTest, ServerCertWithoutKey) {
  auto status = MakeServerCredentials({Cert("server.pem"), "", ""}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("cert_file \"" + Cert("server.pem") + "\""));
  EXPECT_THAT(status.message(), HasSubstr("without its key_file"));
}

TEST_F(TlsCredentialsTest, ServerKeyWithoutCert) {
  auto status = MakeServerCredentials({"", Cert("server.key"), ""}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr(Cert("server.key")));
  EXPECT_THAT(status.message(), HasSubstr("without its cert_file"));
}

TEST_F(TlsCredentialsTest, ClientCaWithoutServerCert) {
  auto status = MakeServerCredentials({"", "", Cert("ca.pem")}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("client_ca_file \"" + Cert("ca.pem") + "\""));
  EXPECT_THAT(status.message(), HasSubstr("without the server's own cert_file"));
}

TEST_F(TlsCredentialsTest, MissingFilesAreNotFoundAndNamed) {
  const std::string missing = ps::testing::TestTmpPath("no-such.pem");
  auto cert = MakeServerCredentials({missing, Cert("server.key"), ""}).status();
  EXPECT_EQ(cert.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(cert.message(), HasSubstr("cert_file \"" + missing + "\""));
  auto key = MakeServerCredentials({Cert("server.pem"), missing, ""}).status();
  EXPECT_EQ(key.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(key.message(), HasSubstr("key_file \"" + missing + "\""));
  auto client_ca =
      MakeServerCredentials({Cert("server.pem"), Cert("server.key"), missing}).status();
  EXPECT_EQ(client_ca.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(client_ca.message(), HasSubstr("client_ca_file \"" + missing + "\""));
  auto ca = MakeChannelCredentials({missing, "", "", ""}).status();
  EXPECT_EQ(ca.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(ca.message(), HasSubstr("ca_file \"" + missing + "\""));
  auto client_key = MakeChannelCredentials({Cert("ca.pem"), Cert("worker.pem"), missing, ""});
  EXPECT_EQ(client_key.status().code(), absl::StatusCode::kNotFound);
}

TEST_F(TlsCredentialsTest, UnreadableFileIsPermissionDenied) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads files whatever their mode";
  const std::string path =
      WriteTmpFile("unreadable.pem", ps::testing::ReadFileBytes(Cert("ca.pem")));
  ASSERT_EQ(::chmod(path.c_str(), 0), 0);
  auto status = MakeChannelCredentials({path, "", "", ""}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(status.message(), HasSubstr(path));
}

TEST_F(TlsCredentialsTest, DirectoryIsRefused) {
  auto status = MakeChannelCredentials({*cert_dir_, "", "", ""}).status();
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr("ca_file \"" + *cert_dir_ + "\": not a regular file"));
}

TEST_F(TlsCredentialsTest, NotPemIsInvalidArgument) {
  const std::string text = WriteTmpFile("not-pem.pem", "hello, I am not a certificate\n");
  const std::string empty = WriteTmpFile("empty.pem", "");
  for (const std::string& bad : {text, empty}) {
    auto cert = MakeServerCredentials({bad, Cert("server.key"), ""}).status();
    EXPECT_EQ(cert.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(cert.message(), HasSubstr("cert_file \"" + bad + "\": not PEM"));
    auto key = MakeServerCredentials({Cert("server.pem"), bad, ""}).status();
    EXPECT_EQ(key.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(key.message(), HasSubstr("key_file \"" + bad + "\": not PEM"));
    auto client_ca = MakeServerCredentials({Cert("server.pem"), Cert("server.key"), bad}).status();
    EXPECT_EQ(client_ca.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(client_ca.message(), HasSubstr("client_ca_file \"" + bad + "\": not PEM"));
    auto ca = MakeChannelCredentials({bad, "", "", ""}).status();
    EXPECT_EQ(ca.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(ca.message(), HasSubstr("ca_file \"" + bad + "\": not PEM"));
  }
  auto empty_status = MakeChannelCredentials({empty, "", "", ""}).status();
  EXPECT_THAT(empty_status.message(), HasSubstr("the file is empty"));
}

TEST_F(TlsCredentialsTest, PemOfTheWrongKindIsInvalidArgument) {
  // A key where the certificate belongs, and the other way round.
  auto cert = MakeServerCredentials({Cert("server.key"), Cert("server.key"), ""}).status();
  EXPECT_EQ(cert.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(cert.message(), HasSubstr("holds no PEM certificate"));
  auto key = MakeServerCredentials({Cert("server.pem"), Cert("server.pem"), ""}).status();
  EXPECT_EQ(key.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(key.message(), HasSubstr("holds no PEM private key"));
  // A CA file whose certificate block is garbage.
  const std::string garbage =
      WriteTmpFile("garbage-ca.pem",
                   "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n");
  auto ca = MakeChannelCredentials({garbage, "", "", ""}).status();
  EXPECT_EQ(ca.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ca.message(), HasSubstr("ca_file \"" + garbage + "\""));
  // A good CA followed by a broken one.
  const std::string half =
      WriteTmpFile("half-good-ca.pem", ps::testing::ReadFileBytes(Cert("ca.pem")) +
                                           "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n"
                                           "-----END CERTIFICATE-----\n");
  auto half_status = MakeChannelCredentials({half, "", "", ""}).status();
  EXPECT_EQ(half_status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(half_status.message(), HasSubstr("certificate 2 does not parse"));
  // Two good CAs in one bundle are fine.
  const std::string bundle =
      WriteTmpFile("bundle.pem", ps::testing::ReadFileBytes(Cert("other-ca.pem")) +
                                     ps::testing::ReadFileBytes(Cert("ca.pem")));
  EXPECT_TRUE(MakeChannelCredentials({bundle, "", "", ""}).ok());
}

TEST_F(TlsCredentialsTest, KeyThatDoesNotMatchTheCert) {
  auto server = MakeServerCredentials({Cert("server.pem"), Cert("worker.key"), ""}).status();
  EXPECT_EQ(server.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(server.message(), HasSubstr("key_file \"" + Cert("worker.key") +
                                          "\" does not match the certificate in"));
  EXPECT_THAT(server.message(), HasSubstr(Cert("server.pem")));
  auto client =
      MakeChannelCredentials({Cert("ca.pem"), Cert("worker.pem"), Cert("other-worker.key"), ""});
  EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(client.status().message(), HasSubstr("does not match"));
}

TEST_F(TlsCredentialsTest, EncryptedKeyIsRefusedWithoutPrompting) {
  const std::string encrypted = ps::testing::TestTmpPath("encrypted.key");
  std::string output;
  ASSERT_EQ(ps::testing::RunCommand(
                absl::StrCat("openssl pkey -in ", ps::testing::ShellQuote(Cert("server.key")),
                             " -aes256 -passout pass:secret -out ",
                             ps::testing::ShellQuote(encrypted), " </dev/null"),
                &output),
            0)
      << output;
  auto status = MakeServerCredentials({Cert("server.pem"), encrypted, ""}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("encrypted"));
}

TEST_F(TlsCredentialsTest, ClientCertWithoutKey) {
  auto status = MakeChannelCredentials({Cert("ca.pem"), Cert("worker.pem"), "", ""}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("cert_file \"" + Cert("worker.pem") + "\""));
  EXPECT_THAT(status.message(), HasSubstr("without its key_file"));
  auto key_only = MakeChannelCredentials({Cert("ca.pem"), "", Cert("worker.key"), ""}).status();
  EXPECT_EQ(key_only.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(key_only.message(), HasSubstr("without its cert_file"));
}

TEST_F(TlsCredentialsTest, ClientSettingsWithoutCaFile) {
  for (const ClientTlsOptions& options :
       {ClientTlsOptions{"", Cert("worker.pem"), Cert("worker.key"), ""},
        ClientTlsOptions{"", "", "", "server"}}) {
    auto status = MakeChannelCredentials(options).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), HasSubstr("without the ca_file"));
  }
}

// The value of channel argument `key` in `args`, "" if absent.
std::string StringChannelArg(const grpc::ChannelArguments& args, const std::string& key) {
  const grpc_channel_args c_args = args.c_channel_args();
  for (size_t i = 0; i < c_args.num_args; ++i) {
    if (key == c_args.args[i].key && c_args.args[i].type == GRPC_ARG_STRING) {
      return c_args.args[i].value.string;
    }
  }
  return "";
}

TEST_F(TlsCredentialsTest, AddTlsChannelArgsSetsTheOverrideOnly) {
  // A fresh ChannelArguments already holds gRPC's own (the user agent).
  const size_t defaults = grpc::ChannelArguments().c_channel_args().num_args;
  grpc::ChannelArguments without;
  AddTlsChannelArgs(GoodWorker(), &without);
  EXPECT_EQ(without.c_channel_args().num_args, defaults);
  EXPECT_EQ(StringChannelArg(without, GRPC_SSL_TARGET_NAME_OVERRIDE_ARG), "");
  grpc::ChannelArguments with;
  with.SetInt("ps.unrelated", 7);
  AddTlsChannelArgs({Cert("ca.pem"), "", "", "server"}, &with);
  EXPECT_EQ(StringChannelArg(with, GRPC_SSL_TARGET_NAME_OVERRIDE_ARG), "server");
  EXPECT_EQ(with.c_channel_args().num_args, defaults + 2);
}

// ---------------------------------------------------------------------------
// Real connections: a health-check server on loopback and fresh channels.

class TlsConnectionTest : public TlsCredentialsTest {
 protected:
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
  }

  // Starts a server with the default health service on 127.0.0.1:0.
  void StartServer(const ServerTlsOptions& options) {
    ASSERT_EQ(server_, nullptr) << "one server at a time";
    auto credentials = MakeServerCredentials(options);
    ASSERT_TRUE(credentials.ok()) << credentials.status();
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", *credentials, &port_);
    // The builder refuses a server with no service of its own to poll for
    // (the health service is added later, in Start); an empty callback
    // generic service, which answers UNIMPLEMENTED, is one.
    // A generic service serves one server only: a new one for each.
    generic_service_ = std::make_unique<grpc::CallbackGenericService>();
    builder.RegisterCallbackGenericService(generic_service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port_, 0);
  }

  std::string Loopback() const { return absl::StrCat("127.0.0.1:", port_); }

  // One grpc.health.v1.Health/Check on a fresh channel (its own subchannel,
  // so every call makes a new connection and handshake). OK means the reply
  // was SERVING.
  grpc::Status Check(const ClientTlsOptions& options, const std::string& target) {
    auto credentials = MakeChannelCredentials(options);
    if (!credentials.ok()) {
      return grpc::Status(grpc::StatusCode::INTERNAL, std::string(credentials.status().message()));
    }
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    AddTlsChannelArgs(options, &args);
    auto channel = grpc::CreateCustomChannel(target, *credentials, args);
    return CheckOn(channel);
  }
  grpc::Status Check(const ClientTlsOptions& options) { return Check(options, Loopback()); }

  static grpc::Status CheckOn(const std::shared_ptr<grpc::Channel>& channel) {
    grpc::GenericStub stub(channel);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    // An empty HealthCheckRequest: the server's overall health.
    grpc::Slice empty("");
    grpc::ByteBuffer request(&empty, 1);
    grpc::ByteBuffer response;
    grpc::Status status;
    absl::Notification done;
    stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                   &response, [&](grpc::Status s) {
                     status = std::move(s);
                     done.Notify();
                   });
    done.WaitForNotification();
    if (!status.ok()) return status;
    std::vector<grpc::Slice> slices;
    if (!response.Dump(&slices).ok()) return grpc::Status(grpc::StatusCode::INTERNAL, "dump");
    std::string bytes;
    for (const grpc::Slice& s : slices) {
      bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
    // HealthCheckResponse{status: SERVING}: field 1, varint 1.
    if (bytes != std::string("\x08\x01", 2)) {
      return grpc::Status(grpc::StatusCode::INTERNAL, "not SERVING");
    }
    return grpc::Status::OK;
  }

  std::unique_ptr<grpc::CallbackGenericService> generic_service_;  // outlives server_
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

// Failures must be the handshake's (UNAVAILABLE), not a hang to the deadline.
void ExpectRefused(const grpc::Status& status, const std::string& what) {
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << what << ": " << status.error_code() << " " << status.error_message();
}

TEST_F(TlsConnectionTest, MutualTls) {
  ASSERT_NO_FATAL_FAILURE(StartServer(MutualServer()));
  // (a) the right CA and a worker certificate signed by it.
  grpc::Status ok = Check(GoodWorker());
  EXPECT_TRUE(ok.ok()) << ok.error_code() << " " << ok.error_message();
  // (b) plaintext.
  ExpectRefused(Check(ClientTlsOptions{}), "insecure client");
  // (c) TLS but no client certificate.
  ExpectRefused(Check({Cert("ca.pem"), "", "", ""}), "no client certificate");
  // (d) a client certificate from another CA.
  ExpectRefused(Check({Cert("ca.pem"), Cert("other-worker.pem"), Cert("other-worker.key"), ""}),
                "client certificate of other-ca");
  // (e) a client that does not trust the server's CA.
  ExpectRefused(Check({Cert("other-ca.pem"), Cert("worker.pem"), Cert("worker.key"), ""}),
                "client trusting other-ca only");
}

TEST_F(TlsConnectionTest, ServerNames) {
  ASSERT_NO_FATAL_FAILURE(StartServer(MutualServer()));
  ClientTlsOptions worker = GoodWorker();
  // DNS:localhost in the SAN.
  grpc::Status localhost = Check(worker, absl::StrCat("localhost:", port_));
  EXPECT_TRUE(localhost.ok()) << localhost.error_message();
  // Dialing an address while expecting another name that the cert has.
  for (const std::string name : {"server", kExtraServerName}) {
    worker.server_name_override = name;
    grpc::Status status = Check(worker);
    EXPECT_TRUE(status.ok()) << name << ": " << status.error_message();
  }
  // A name the certificate does not carry.
  worker.server_name_override = "elsewhere.example";
  ExpectRefused(Check(worker), "name not in the server certificate");
}

TEST_F(TlsConnectionTest, ServerOnlyTls) {
  ASSERT_NO_FATAL_FAILURE(StartServer({Cert("server.pem"), Cert("server.key"), ""}));
  grpc::Status ca_only = Check({Cert("ca.pem"), "", "", ""});
  EXPECT_TRUE(ca_only.ok()) << ca_only.error_message();
  // A client certificate is not asked for, so presenting one is harmless.
  grpc::Status with_cert = Check(GoodWorker());
  EXPECT_TRUE(with_cert.ok()) << with_cert.error_message();
  ExpectRefused(Check(ClientTlsOptions{}), "insecure client");
  ExpectRefused(Check({Cert("other-ca.pem"), "", "", ""}), "client trusting other-ca only");
}

TEST_F(TlsConnectionTest, Plaintext) {
  ASSERT_NO_FATAL_FAILURE(StartServer(ServerTlsOptions{}));
  grpc::Status insecure = Check(ClientTlsOptions{});
  EXPECT_TRUE(insecure.ok()) << insecure.error_message();
  ExpectRefused(Check({Cert("ca.pem"), "", "", ""}), "TLS client to a plaintext server");
}

// Not a benchmark: one rough number for the record, printed to the test log.
// A fresh channel's first call (TCP connect, and for mTLS the handshake with
// both certificates), then calls on the warm channel.
TEST_F(TlsConnectionTest, HandshakeCost) {
  constexpr int kChannels = 20;
  constexpr int kWarmCalls = 200;
  struct Row {
    const char* name;
    ServerTlsOptions server;
    ClientTlsOptions client;
  };
  for (const Row& row : {Row{"plaintext", ServerTlsOptions{}, ClientTlsOptions{}},
                         Row{"mutual TLS", MutualServer(), GoodWorker()}}) {
    ASSERT_NO_FATAL_FAILURE(StartServer(row.server));
    const absl::Time start = absl::Now();
    for (int i = 0; i < kChannels; ++i) ASSERT_TRUE(Check(row.client).ok()) << row.name;
    const absl::Duration first_call = (absl::Now() - start) / kChannels;

    auto credentials = MakeChannelCredentials(row.client);
    ASSERT_TRUE(credentials.ok());
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto channel = grpc::CreateCustomChannel(Loopback(), *credentials, args);
    ASSERT_TRUE(CheckOn(channel).ok());
    const absl::Time warm_start = absl::Now();
    for (int i = 0; i < kWarmCalls; ++i) ASSERT_TRUE(CheckOn(channel).ok());
    const absl::Duration warm_call = (absl::Now() - warm_start) / kWarmCalls;
    std::printf("handshake cost, %s: first call on a fresh channel %.3f ms, warm call %.3f ms\n",
                row.name, absl::ToDoubleMilliseconds(first_call),
                absl::ToDoubleMilliseconds(warm_call));
    server_->Shutdown(std::chrono::system_clock::now());
    server_.reset();
  }
}

}  // namespace
}  // namespace ps
