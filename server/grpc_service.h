#ifndef PS_SERVER_GRPC_SERVICE_H_
#define PS_SERVER_GRPC_SERVICE_H_

#include <atomic>
#include <functional>
#include <map>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/shared_memory.h"
#include "proto/parameter_server.grpc.pb.h"
#include "proto/parameter_server.pb.h"
#include "server/call_admission.h"
#include "server/parameter_server.h"
#include "server/register_request.h"
#include "server/chunk_coding.h"
#include "server/job_run.h"
#include "server/paced_replies.h"
#include "server/shared_memory_sessions.h"
#include "server/waiting_pulls.h"

namespace ps::server {
// The gRPC face of ParameterServer: translates messages to domain calls and
// statuses back, and checks what the domain cannot see (framing, data length
// a whole number of elements, supported dtype, sane timeouts). Thread-safe;
// the ParameterServer must outlive it.
//
// Every method runs on the callback API and parses its own request (one
// that does not parse is INVALID_ARGUMENT). Register and Heartbeat answer
// at once; Wait waits as a pull of no chunks does (below), holding no
// thread. Initialize, Push and Pull carry frames (proto/wire_format.h)
// without a protobuf `bytes` copy:
//   - Push and Initialize read the received slices in place: the domain
//     checks and sums straight from them (ParameterServer::PushChunkBytes);
//   - a Pull reply's data slices point into the parameters of the version
//     pulled (ParameterServer::PullChunkViews), which stay unchanged until
//     gRPC drops the slices after sending them; an update meanwhile writes a
//     fresh buffer (one model's memory while such a reply is in flight).
// A worker on this host may offer shared memory when it registers
// (parameter_server.proto, SharedMemory): its pushes then name byte ranges
// of it, which Push copies out (one memcpy, so the values checked are the
// values summed whatever the worker writes meanwhile), and its pulls name
// where each chunk goes, which the answer copies into (one memcpy): no
// tensor byte crosses TCP. The segment is bound to the registration's
// session; calls of other sessions cannot name it.
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
// (ServiceOptions::max_waiting_pulls).
//
// Credentials (parameter_server.proto, "Credentials"): every call is
// checked for the job token first, when there is one; Initialize and Push
// for their rank's session credential (ParameterServer::CheckSession), Pull
// and Wait for the server's incarnation when they carry a session.
//
// Shutting down: grpc::Server::Shutdown() without a deadline waits for every
// call in flight, waiting pulls included, so call Shutdown() on the service
// first (or give the server's Shutdown a deadline: its cancellations answer
// the waiting pulls through OnCancel); destroy the service after the
// grpc::Server has shut down.
struct ServiceOptions {
  // At most this many pulls wait at once (RESOURCE_EXHAUSTED, naming the
  // cap, beyond), so a hostile client cannot grow the server's memory
  // without bound. 16 workers x 21 messages wait 336. Each holds its
  // request, its reactor and a few index entries (a few hundred bytes)
  // besides gRPC's own state for the call: 1000 waiting pulls raised the
  // test's resident memory (client and server in one process) by 39 MB, so
  // the cap bounds the server's share to about 1-2 GB.
  int64_t max_waiting_pulls = 65536;
  // The job's shared secret (common/job_token.h): every call must carry it
  // as the metadata "ps-job-token" (UNAUTHENTICATED otherwise, before
  // anything is read). Empty: no token needed.
  std::string job_token;
  // Heartbeat replies carry the stall report (server/stall_report.h) once
  // an iteration has waited this long; a rank is lost after this long
  // without a sign of life.
  absl::Duration stall_report_after = absl::Seconds(5);
  absl::Duration liveness_timeout = absl::Seconds(10);
  // The server requires client certificates (mutual TLS): a registration
  // for worker id X is accepted only from a certificate whose CN or a
  // subjectAltName is X (PERMISSION_DENIED otherwise), and that certificate
  // is its identity. Otherwise a registration naming a live worker's id
  // must carry that worker's identity proof (ALREADY_EXISTS, with the
  // trailing metadata proto::kRetryRegisterMetadataKey, until the holder
  // is lost). See WorkerLedger::CheckIdentity.
  bool client_certificates = false;
  // The job shrinks when it loses a worker (RegisterReply.shrinks).
  bool shrinks = false;
  // Told each call's method ("Push", ...) and final code as it is answered
  // (for metrics); must be thread-safe and quick. May be empty.
  std::function<void(absl::string_view method, absl::StatusCode code)> on_answer;
  // Asynchronous and ssp:S consistency: told each accepted push's
  // staleness (async: updates behind; ssp: iterations behind). May be
  // empty.
  std::function<void(int64_t staleness)> on_staleness;
  // Synchronous consistency: the reply to a push that leaves its rank more
  // than this many bytes of gradient (4 per element) ahead of the slowest
  // member waits while the slowest is pushing (it pushed within
  // push_lead_idle) and is not within the lead again, at most
  // push_hold_limit (server/push_pacer.h says why, and why it cannot
  // deadlock). It slows a worker only if its bound on bytes in flight is
  // small next to what the link carries in push_lead_idle. 0: off.
  int64_t max_push_lead_bytes = 0;
  absl::Duration push_lead_idle = absl::Milliseconds(20);
  absl::Duration push_hold_limit = absl::Seconds(1);
  // The run the server's state belongs to (RegisterReply.job_run): a
  // registration's proposal is adopted while it has none. Null: the
  // service keeps none (replies say ""). Must outlive the service.
  JobRun* job_run = nullptr;
  // Restore (proto RestoreRequest) to a version below the server's, once
  // the service's checks have passed (token, parse, the rank's session, a
  // version from 0 to the current one; the current one is answered OK at
  // once): the owner decides and runs `done` with the answer, on any
  // thread. Empty: FAILED_PRECONDITION, the server keeps no checkpoints.
  std::function<void(int64_t version, std::function<void(absl::Status)> done)> restore;
};

class ParameterServerService final
    : public proto::ParameterServer::WithRawCallbackMethod_Register<
          proto::ParameterServer::WithRawCallbackMethod_Initialize<
              proto::ParameterServer::WithRawCallbackMethod_Push<
                  proto::ParameterServer::WithRawCallbackMethod_Wait<
                      proto::ParameterServer::WithRawCallbackMethod_Pull<
                          proto::ParameterServer::WithRawCallbackMethod_Heartbeat<
                              proto::ParameterServer::WithRawCallbackMethod_Describe<
                                  proto::ParameterServer::WithRawCallbackMethod_Restore<
                                      proto::ParameterServer::Service>>>>>>>> {
 public:
  explicit ParameterServerService(ParameterServer* server, ServiceOptions options = {});
  // Calls Shutdown().
  ~ParameterServerService() override;

  // From now on every call is answered UNAVAILABLE "server shutting down:
  // <reason>" at once, before it is read (workers take it as a reason to
  // reconnect, not to fail); waiting pulls are left to Shutdown. Idempotent.
  void StopServing(const std::string& reason);
  // The job cannot go on (a worker lost for good under the wait policy):
  // every waiting pull and every later call is answered with `status`
  // (which must not be a code workers reconnect on), so the workers fail
  // with its message instead of waiting. Idempotent: the first status stays.
  void FailJob(const absl::Status& status);
  // ParameterServer::DropWorker, answering the pulls it made ready.
  absl::Status DropWorker(int rank);
  // What each rank's last heartbeat said it had done (HeartbeatRequest),
  // by rank; for the server's metrics.
  std::map<int, proto::HeartbeatRequest> worker_reports() const;

  // Answers every waiting pull with UNAVAILABLE "server shutting down", and
  // from now on every pull that would wait too (pulls that can be answered
  // at once still are), and stops the deadline thread. Idempotent and
  // thread-safe; returns once the deadline thread has stopped (it waits
  // for no push or pull in flight).
  void Shutdown();
  // Pulls waiting now for their chunks.
  int64_t waiting_pulls() const;

  // Every method parses its own request (a body that does not parse is
  // INVALID_ARGUMENT, as the proto says, not gRPC's INTERNAL), on the
  // callback API.
  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* reply) override;
  // Waits like a pull of no chunks (no thread held), answered with a
  // WaitReply.
  grpc::ServerUnaryReactor* Wait(grpc::CallbackServerContext* context,
                                 const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* reply) override;
  grpc::ServerUnaryReactor* Initialize(grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* reply) override;
  grpc::ServerUnaryReactor* Push(grpc::CallbackServerContext* context,
                                 const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* reply) override;
  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext* context,
                                 const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* reply) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* reply) override;
  grpc::ServerUnaryReactor* Describe(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* reply) override;
  // Answered when ServiceOptions::restore has decided (or at once by the
  // service's own checks), holding no thread meanwhile.
  grpc::ServerUnaryReactor* Restore(grpc::CallbackServerContext* context,
                                    const grpc::ByteBuffer* request,
                                    grpc::ByteBuffer* reply) override;


 private:
  // Each returns the chunks it sent (which may have published some); DoPush
  // also what the pacer counts when the push's reply may be held
  // (synchronous, max_push_lead_bytes > 0).
  absl::Status DoInitialize(const grpc::ServerContextBase& context,
                            const grpc::ByteBuffer& request,
                            std::vector<ParameterServer::ChunkId>* sent);
  absl::Status DoPush(const grpc::ServerContextBase& context, const grpc::ByteBuffer& request,
                      std::vector<ParameterServer::ChunkId>* sent, proto::PushReply* reply,
                      std::optional<PacedReplies::Push>* paced);
  // Takes views of the chunks `ids` (checked: they exist and fit one
  // message) from the version `request` asks for, waiting until `deadline`,
  // and frames them into `reply`.
  absl::Status AnswerPull(const proto::PullRequest& request,
                          const std::vector<ParameterServer::ChunkId>& ids,
                          const SharedMemorySegment* segment, absl::Time deadline, bool wait,
                          grpc::ByteBuffer* reply);
  absl::Status DoRegister(const grpc::ServerContextBase& context,
                          const proto::RegisterRequest& request, proto::RegisterReply* reply);
  absl::Status DoHeartbeat(const grpc::ServerContextBase& context,
                           const proto::HeartbeatRequest& request, proto::HeartbeatReply* reply);
  // A Pull or Wait past its checks: answered at once when its chunks (or
  // version) are there or its deadline has passed, else filed to wait.
  grpc::ServerUnaryReactor* PullOrWait(grpc::CallbackServerContext* context,
                                       proto::PullRequest pull,
                                       std::vector<ParameterServer::ChunkId> ids,
                                       std::shared_ptr<SharedMemorySegment> segment, bool wait,
                                       grpc::ByteBuffer* reply);

  // Reports `status` of a `method` call to options_.on_answer; returns it.
  const absl::Status& Answered(absl::string_view method, const absl::Status& status) const;
  // OK, or why the call must be refused before it is read (CallAdmission).
  absl::Status CheckCall(const grpc::ServerContextBase& context) const;
  // The ps-session metadata of a call ("" when absent).
  static std::string SessionOf(const grpc::ServerContextBase& context);
  // A session given on a Pull or Wait must be this incarnation's (kAborted
  // otherwise: the worker must learn that the server restarted).
  absl::Status CheckOptionalSession(const grpc::ServerContextBase& context) const;

  ParameterServer* const server_;
  const ServiceOptions options_;
  SharedMemorySessions shared_memory_;
  CallAdmission admission_;
  mutable absl::Mutex reports_mu_;
  std::map<int, proto::HeartbeatRequest> reports_ ABSL_GUARDED_BY(reports_mu_);
  const ServerReadiness readiness_;
  // Shared with the waiting reactors, whose OnCancel may come after the
  // service has answered them.
  const std::shared_ptr<WaitingPulls> waiting_;
  // Held push replies (ServiceOptions::max_push_lead_bytes).
  PacedReplies paced_replies_;
};

}  // namespace ps::server

#endif  // PS_SERVER_GRPC_SERVICE_H_
