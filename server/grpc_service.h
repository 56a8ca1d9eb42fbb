#ifndef PS_SERVER_GRPC_SERVICE_H_
#define PS_SERVER_GRPC_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include "proto/parameter_server.grpc.pb.h"
#include "server/parameter_server.h"

namespace ps::server {

// The gRPC face of ParameterServer: translates messages to domain calls and
// statuses back, and checks what the domain cannot see (data length a whole
// number of elements, supported dtype, sane timeouts). Thread-safe; the
// ParameterServer must outlive it. Blocking calls (Wait, Pull) hold a server
// thread while they wait, bounded by their timeout.
class ParameterServerService final : public proto::ParameterServer::Service {
 public:
  explicit ParameterServerService(ParameterServer* server) : server_(server) {}

  grpc::Status Register(grpc::ServerContext* context, const proto::RegisterRequest* request,
                        proto::RegisterReply* reply) override;
  grpc::Status Initialize(grpc::ServerContext* context, const proto::InitializeRequest* request,
                          proto::InitializeReply* reply) override;
  grpc::Status Push(grpc::ServerContext* context, const proto::PushRequest* request,
                    proto::PushReply* reply) override;
  grpc::Status Wait(grpc::ServerContext* context, const proto::WaitRequest* request,
                    proto::WaitReply* reply) override;
  grpc::Status Pull(grpc::ServerContext* context, const proto::PullRequest* request,
                    proto::PullReply* reply) override;

 private:
  ParameterServer* const server_;
};

}  // namespace ps::server

#endif  // PS_SERVER_GRPC_SERVICE_H_
