// ps-health: asks a server's gRPC health service (grpc.health.v1.Health/Check)
// whether it serves, for container health checks and init containers that
// wait for the servers. One call, with a deadline; the exit status says:
//   0  SERVING
//   1  reached, but not serving: NOT_SERVING / UNKNOWN (e.g. stopping), or
//      the call refused (NOT_FOUND: no such --service; UNIMPLEMENTED: no
//      health service; any other code but the two below)
//   2  not reached: UNAVAILABLE (refused, unresolvable, TLS handshake
//      failed) or DEADLINE_EXCEEDED
//   3  bad flags (a --timeout of 0 or less) or unreadable TLS files
// and one line on stdout names the address and the answer or the error.
//
//   ps-health --address=ps-server-0:50051 [--timeout=2s] [--tls_ca=...]
#include <cstdio>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/time/time.h"
#include "common/tls_credentials.h"
#include "proto/health.grpc.pb.h"

ABSL_FLAG(std::string, address, "127.0.0.1:50051", "the server's HOST:PORT");
ABSL_FLAG(std::string, service, "", "the health service name to ask about (\"\": the server)");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(2), "deadline of the check, connecting included");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA of the server's certificate: check over TLS");
ABSL_FLAG(std::string, tls_cert, "", "PEM client certificate for mutual TLS (with --tls_key)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_server_name, "",
          "name the server's certificate carries, when not the host in --address");

namespace {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

int Run() {
  const std::string address = absl::GetFlag(FLAGS_address);
  if (absl::GetFlag(FLAGS_timeout) <= absl::ZeroDuration()) {
    std::printf("ps-health: --timeout=%s must be > 0\n",
                absl::FormatDuration(absl::GetFlag(FLAGS_timeout)).c_str());
    return 3;
  }
  const ps::ClientTlsOptions tls{absl::GetFlag(FLAGS_tls_ca), absl::GetFlag(FLAGS_tls_cert),
                                 absl::GetFlag(FLAGS_tls_key),
                                 absl::GetFlag(FLAGS_tls_server_name)};
  auto credentials = ps::MakeChannelCredentials(tls);
  if (!credentials.ok()) {
    std::printf("ps-health: %s\n", credentials.status().ToString().c_str());
    return 3;
  }
  grpc::ChannelArguments args;
  ps::AddTlsChannelArgs(tls, &args);
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateCustomChannel(address, *credentials, args));

  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::GetFlag(FLAGS_timeout)));
  // Fail fast is right for a probe: an unreachable server is an answer.
  HealthCheckRequest request;
  request.set_service(absl::GetFlag(FLAGS_service));
  HealthCheckResponse response;
  const grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok()) {
    // Only these two mean the server was not reached; any other code is
    // its answer (an unknown --service is NOT_FOUND).
    const bool reached = status.error_code() != grpc::StatusCode::UNAVAILABLE &&
                         status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED;
    std::printf("ps-health: %s %s: %s (code %d)\n", address.c_str(),
                reached ? "refused the check" : "not reached", status.error_message().c_str(),
                static_cast<int>(status.error_code()));
    return reached ? 1 : 2;
  }
  const std::string answer = HealthCheckResponse::ServingStatus_Name(response.status());
  std::printf("ps-health: %s %s\n", address.c_str(), answer.c_str());
  return response.status() == HealthCheckResponse::SERVING ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Checks a parameter server's gRPC health service. Exit status: 0 serving, 1 not "
      "serving, 2 not reached, 3 bad flags.");
  const auto positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() > 1) {
    std::printf("ps-health: unexpected argument %s (flags only)\n", positional[1]);
    return 3;
  }
  return Run();
}
