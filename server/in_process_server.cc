#include "server/in_process_server.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ps::server {

absl::StatusOr<std::unique_ptr<InProcessServer>> InProcessServer::Start(
    const ParameterServerOptions& options, std::vector<ParamSpec> signature,
    std::vector<float> initial, int port) {
  std::unique_ptr<InProcessServer> s(new InProcessServer());
  if (signature.empty()) {
    PS_ASSIGN_OR_RETURN(s->server_, ParameterServer::Create(options, &s->device_));
  } else {
    PS_ASSIGN_OR_RETURN(s->server_, ParameterServer::Create(options, std::move(signature),
                                                            std::move(initial), &s->device_));
  }
  s->service_ = std::make_unique<ParameterServerService>(s->server_.get());
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat("127.0.0.1:", port), grpc::InsecureServerCredentials(),
                           &s->port_);
  builder.RegisterService(s->service_.get());
  s->grpc_server_ = builder.BuildAndStart();
  if (s->grpc_server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(
        port == 0 ? std::string("cannot listen on a loopback port")
                  : absl::StrCat("cannot listen on loopback port ", port));
  }
  return s;
}

InProcessServer::~InProcessServer() {
  // Waiting pulls first: the server's Shutdown waits for every call in flight.
  if (service_ != nullptr) service_->Shutdown();
  if (grpc_server_ != nullptr) grpc_server_->Shutdown();
}

std::string InProcessServer::address() const { return absl::StrCat("127.0.0.1:", port_); }

}  // namespace ps::server
