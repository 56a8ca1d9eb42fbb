#ifndef PS_SERVER_GRPC_SERVICE_H_
#define PS_SERVER_GRPC_SERVICE_H_

#include <list>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "proto/parameter_server.grpc.pb.h"
#include "proto/parameter_server.pb.h"
#include "server/parameter_server.h"

namespace ps::server {

// The gRPC face of ParameterServer: translates messages to domain calls and
// statuses back, and checks what the domain cannot see (framing, data length
// a whole number of elements, supported dtype, sane timeouts). Thread-safe;
// the ParameterServer must outlive it.
//
// Register and Wait are synchronous protobuf methods: Wait holds a server
// thread while it waits, bounded by its timeout. Initialize, Push and Pull
// carry frames (proto/wire_format.h) through the callback API without a
// protobuf `bytes` copy:
//   - Push and Initialize read the received slices in place: the domain
//     checks and sums straight from them (ParameterServer::PushChunkBytes);
//   - a Pull reply's data slices point into the parameters of the version
//     pulled (ParameterServer::PullChunkViews), which stay unchanged until
//     gRPC drops the slices after sending them; an update meanwhile writes a
//     fresh buffer (one model's memory while such a reply is in flight).
// A Pull whose version does not exist yet waits on a thread of its own (at
// most kMaxWaitingPulls at once; RESOURCE_EXHAUSTED beyond), never on
// gRPC's; the destructor joins them, so destroy the service after the
// grpc::Server has shut down.
class ParameterServerService final
    : public proto::ParameterServer::WithRawCallbackMethod_Initialize<
          proto::ParameterServer::WithRawCallbackMethod_Push<
              proto::ParameterServer::WithRawCallbackMethod_Pull<
                  proto::ParameterServer::Service>>> {
 public:
  static constexpr int kMaxWaitingPulls = 256;

  explicit ParameterServerService(ParameterServer* server) : server_(server) {}
  ~ParameterServerService() override;

  grpc::Status Register(grpc::ServerContext* context, const proto::RegisterRequest* request,
                        proto::RegisterReply* reply) override;
  grpc::Status Wait(grpc::ServerContext* context, const proto::WaitRequest* request,
                    proto::WaitReply* reply) override;
  grpc::ServerUnaryReactor* Initialize(grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* reply) override;
  grpc::ServerUnaryReactor* Push(grpc::CallbackServerContext* context,
                                 const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* reply) override;
  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext* context,
                                 const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* reply) override;

 private:
  absl::Status DoInitialize(const grpc::ByteBuffer& request);
  absl::Status DoPush(const grpc::ByteBuffer& request);
  // Takes views of the chunks `ids` (checked: they exist and fit one
  // message) from the version `request` asks for, waiting until `deadline`,
  // and frames them into `reply`.
  absl::Status AnswerPull(const proto::PullRequest& request,
                          const std::vector<ParameterServer::ChunkId>& ids, absl::Time deadline,
                          grpc::ByteBuffer* reply);

  ParameterServer* const server_;

  struct Waiter {
    std::thread thread;
    bool done = false;
  };
  absl::Mutex waiters_mu_;
  std::list<Waiter> waiters_ ABSL_GUARDED_BY(waiters_mu_);
};

}  // namespace ps::server

#endif  // PS_SERVER_GRPC_SERVICE_H_
