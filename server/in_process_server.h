#ifndef PS_SERVER_IN_PROCESS_SERVER_H_
#define PS_SERVER_IN_PROCESS_SERVER_H_

// For tests and benchmarks: a real parameter server (the domain object and
// its gRPC service) listening on a free loopback port of this process.

#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "common/cpu_device.h"
#include "server/grpc_service.h"
#include "server/parameter_server.h"

namespace ps::server {

class InProcessServer {
 public:
  // A server without parameters (rank 0 sends them), or one that starts
  // from `initial` in `signature` order, on loopback port `port` (0: any
  // free one; a given one lets a test restart a server where its workers
  // look for it). kUnavailable when the port cannot be bound; the options'
  // errors as ParameterServer::Create.
  static absl::StatusOr<std::unique_ptr<InProcessServer>> Start(
      const ParameterServerOptions& options, std::vector<ParamSpec> signature = {},
      std::vector<float> initial = {}, int port = 0);
  int port() const { return port_; }
  ~InProcessServer();

  // "127.0.0.1:PORT".
  std::string address() const;
  ParameterServer& domain() { return *server_; }

 private:
  InProcessServer() = default;

  CpuDevice device_{0, 1};
  std::unique_ptr<ParameterServer> server_;
  std::unique_ptr<ParameterServerService> service_;
  std::unique_ptr<grpc::Server> grpc_server_;
  int port_ = 0;
};

}  // namespace ps::server

#endif  // PS_SERVER_IN_PROCESS_SERVER_H_
