#ifndef PS_SERVER_HEALTH_LISTENER_H_
#define PS_SERVER_HEALTH_LISTENER_H_

// A second listener that serves only gRPC's health check
// (grpc.health.v1.Health/Check), in plaintext and without the job token:
// for probes that can neither speak TLS nor present a client certificate,
// such as the kubelet's native gRPC probes, while the job's own port stays
// mutual TLS. It answers nothing but "serving" or "not serving" for the
// server as a whole (service ""), so it tells nobody anything of the job.

#include <atomic>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "proto/health.grpc.pb.h"

namespace ps::server {

class HealthListener {
 public:
  // Listens on `address` ("host:port"; port 0 picks a free one), reporting
  // not serving until SetServing(true). kUnavailable naming the address
  // when it cannot listen there (a port another process holds included).
  static absl::StatusOr<std::unique_ptr<HealthListener>> Start(const std::string& address);
  // Stops listening, answering the calls in flight.
  ~HealthListener();

  int port() const { return port_; }
  // What Check answers for the server (""): mirrors the job's port,
  // serving once it serves and not while it shuts down. Any other service
  // name is NOT_FOUND, Watch UNIMPLEMENTED.
  void SetServing(bool serving) { service_.serving = serving; }

 private:
  struct Service final : grpc::health::v1::Health::Service {
    grpc::Status Check(grpc::ServerContext* context,
                       const grpc::health::v1::HealthCheckRequest* request,
                       grpc::health::v1::HealthCheckResponse* response) override;
    std::atomic<bool> serving{false};
  };

  HealthListener() = default;
  Service service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace ps::server

#endif  // PS_SERVER_HEALTH_LISTENER_H_
