#ifndef PS_SERVER_GRPC_SERVICE_H_
#define PS_SERVER_GRPC_SERVICE_H_

#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/parameter_server.grpc.pb.h"
#include "proto/parameter_server.pb.h"
#include "server/parameter_server.h"

namespace ps::server {
namespace internal {
class WaitingPull;
class WaitingPulls;
}  // namespace internal

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
// A Pull whose chunks do not exist yet waits without pinning a thread: it is
// recorded (its reactor, request and deadline) and answered
//   - by the Push, Initialize or Register call that makes its chunks exist,
//     on that call's gRPC thread once the call has finished (answering takes
//     views, copying nothing);
//   - at its deadline, min(timeout_ms capped at an hour, the call's
//     deadline), with the DEADLINE_EXCEEDED that PullChunkViews gives (or
//     its chunks, if they came meanwhile), by the service's one deadline
//     thread, which sleeps until the nearest deadline or a wake-up;
//   - at once when its client cancels it (ServerUnaryReactor::OnCancel):
//     CANCELLED, which nobody hears, and the record is dropped;
//   - with UNAVAILABLE "server shutting down" by Shutdown.
// Exactly one of them answers each waiting pull. Pulls made ready by calls
// on the ParameterServer directly, not through this service, are answered
// at their deadline. At most max_waiting_pulls pulls wait at once
// (RESOURCE_EXHAUSTED, naming the cap, beyond), so a hostile client cannot
// grow the server's memory without bound.
//
// Shutting down: grpc::Server::Shutdown() without a deadline waits for every
// call in flight, waiting pulls included, so call Shutdown() on the service
// first (or give the server's Shutdown a deadline: its cancellations answer
// the waiting pulls through OnCancel); destroy the service after the
// grpc::Server has shut down.
class ParameterServerService final
    : public proto::ParameterServer::WithRawCallbackMethod_Initialize<
          proto::ParameterServer::WithRawCallbackMethod_Push<
              proto::ParameterServer::WithRawCallbackMethod_Pull<
                  proto::ParameterServer::Service>>> {
 public:
  // The default cap on waiting pulls: 16 workers x 21 messages wait 336.
  // Each holds its request, its reactor and a few index entries (a few
  // hundred bytes) besides gRPC's own state for the call: 1000 waiting
  // pulls raised the test's resident memory (client and server in one
  // process) by 39 MB, so the cap bounds the server's share to about 1-2 GB.
  static constexpr int64_t kMaxWaitingPulls = 65536;

  explicit ParameterServerService(ParameterServer* server,
                                  int64_t max_waiting_pulls = kMaxWaitingPulls);
  // Calls Shutdown().
  ~ParameterServerService() override;

  // Answers every waiting pull with UNAVAILABLE "server shutting down", and
  // from now on every pull that would wait too (pulls that can be answered
  // at once still are), and stops the deadline thread. Idempotent and
  // thread-safe; returns once the deadline thread has stopped (it waits
  // for no push or pull in flight).
  void Shutdown();
  // Pulls waiting now for their chunks.
  int64_t waiting_pulls() const;

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
  // Each returns the chunks it sent (which may have published some).
  absl::Status DoInitialize(const grpc::ByteBuffer& request,
                            std::vector<ParameterServer::ChunkId>* sent);
  absl::Status DoPush(const grpc::ByteBuffer& request,
                      std::vector<ParameterServer::ChunkId>* sent);
  // Takes views of the chunks `ids` (checked: they exist and fit one
  // message) from the version `request` asks for, waiting until `deadline`,
  // and frames them into `reply`.
  absl::Status AnswerPull(const proto::PullRequest& request,
                          const std::vector<ParameterServer::ChunkId>& ids, absl::Time deadline,
                          grpc::ByteBuffer* reply);
  // Answers the waiting pulls that a successful call sending `sent` (and
  // perhaps completing version 0 or the server's version) has made ready.
  void AnswerReadyPulls(absl::Span<const ParameterServer::ChunkId> sent);
  // Finishes waiting pulls, now out of the index, with their chunks or the
  // error PullChunkViews gives at once (never waiting).
  void AnswerNow(const std::vector<internal::WaitingPull*>& pulls);
  // The deadline thread's loop: answers each waiting pull at its deadline.
  void AnswerAtDeadlines();

  ParameterServer* const server_;
  // Shared with the waiting reactors, whose OnCancel may come after the
  // service has answered them.
  const std::shared_ptr<internal::WaitingPulls> waiting_;
  absl::Mutex shutdown_mu_;
  std::thread deadline_thread_ ABSL_GUARDED_BY(shutdown_mu_);
};

}  // namespace ps::server

#endif  // PS_SERVER_GRPC_SERVICE_H_
