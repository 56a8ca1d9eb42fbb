#include "server/health_listener.h"

#include "absl/strings/str_cat.h"

namespace ps::server {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

grpc::Status HealthListener::Service::Check(grpc::ServerContext* context,
                                            const HealthCheckRequest* request,
                                            HealthCheckResponse* response) {
  if (!request->service().empty()) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        "this port answers for the server as a whole (service \"\") only");
  }
  response->set_status(serving ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING);
  return grpc::Status::OK;
}

absl::StatusOr<std::unique_ptr<HealthListener>> HealthListener::Start(const std::string& address) {
  std::unique_ptr<HealthListener> listener(new HealthListener());
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &listener->port_);
  // A port another process holds is an error, not a port shared with it.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Registered by name, this service keeps gRPC's default one (which the
  // job's port enables process-wide) off this server.
  builder.RegisterService(&listener->service_);
  listener->server_ = builder.BuildAndStart();
  if (listener->server_ == nullptr || listener->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", address, " for health checks (--health_port)"));
  }
  return listener;
}

HealthListener::~HealthListener() {
  SetServing(false);
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }
}

}  // namespace ps::server
