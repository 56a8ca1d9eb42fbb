#include "server/grpc_service.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/job_token.h"
#include "common/shared_memory.h"
#include "common/status_macros.h"
#include "proto/wire_format.h"
#include "server/grpc_answers.h"
#include "server/register_request.h"
#include "server/grpc_replies.h"
#include "server/registrant_identity.h"
#include "server/restore_request.h"
#include "server/waiting_pull_call.h"

namespace ps::server {
namespace {

using ChunkId = ParameterServer::ChunkId;

// The server's chunk lengths (-1: no such chunk), for server/chunk_coding.h.
std::function<int64_t(int, int64_t)> ChunkLengths(const ParameterServer& server) {
  return [&server](int key, int64_t chunk) { return server.ChunkLength(key, chunk); };
}

// A received frame that `what` names, as the domain sees it.
ReceivedChunks Received(const ParameterServer& server, ChunkSource source, const char* what,
                        const SharedMemorySegment* shared_memory) {
  return {.source = source,
          .what = what,
          .max_decoded_elements = server.options().chunk_elements,
          .chunk_length = ChunkLengths(server),
          .shared_memory = shared_memory};
}

// The chunks a call sent.
std::vector<ChunkId> IdsOf(absl::Span<const ParameterServer::ChunkBytes> chunks) {
  std::vector<ChunkId> ids;
  ids.reserve(chunks.size());
  for (const ParameterServer::ChunkBytes& chunk : chunks) ids.push_back({chunk.key, chunk.chunk});
  return ids;
}

}  // namespace

ParameterServerService::ParameterServerService(ParameterServer* server, ServiceOptions options)
    : server_(server),
      options_(std::move(options)),
      admission_(options_.job_token),
      readiness_(server),
      waiting_(std::make_shared<WaitingPulls>(
          &readiness_, WaitingPulls::Options{.max_pulls = options_.max_waiting_pulls})),
      paced_replies_({.max_lead_elements = options_.max_push_lead_bytes / 4,
                      .idle_after = options_.push_lead_idle,
                      .max_hold = options_.push_hold_limit}) {}

ParameterServerService::~ParameterServerService() { Shutdown(); }

void ParameterServerService::Shutdown() {
  waiting_->Close(absl::UnavailableError("server shutting down"));
  paced_replies_.Shutdown();
}

int64_t ParameterServerService::waiting_pulls() const { return waiting_->size(); }

void ParameterServerService::StopServing(const std::string& reason) { admission_.Stop(reason); }

void ParameterServerService::FailJob(const absl::Status& status) {
  if (admission_.Fail(status)) waiting_->Close(status);
}

std::map<int, proto::HeartbeatRequest> ParameterServerService::worker_reports() const {
  absl::MutexLock lock(&reports_mu_);
  return reports_;
}

absl::Status ParameterServerService::DropWorker(int rank) {
  PS_ASSIGN_OR_RETURN(const std::vector<ChunkId> completed, server_->DropWorker(rank));
  waiting_->AnswerReady(completed);
  return absl::OkStatus();
}

const absl::Status& ParameterServerService::Answered(absl::string_view method,
                                                    const absl::Status& status) const {
  if (options_.on_answer) options_.on_answer(method, status.code());
  return status;
}

absl::Status ParameterServerService::CheckCall(const grpc::ServerContextBase& context) const {
  return admission_.Admit(MetadataOf(context, kJobTokenMetadataKey));
}

std::string ParameterServerService::SessionOf(const grpc::ServerContextBase& context) {
  return std::string(MetadataOf(context, proto::kSessionMetadataKey));
}

absl::Status ParameterServerService::CheckOptionalSession(
    const grpc::ServerContextBase& context) const {
  const std::string session = SessionOf(context);
  if (session.empty()) return absl::OkStatus();
  return server_->CheckIncarnation(session);
}

absl::Status ParameterServerService::DoRegister(const grpc::ServerContextBase& context,
                                                const proto::RegisterRequest& request,
                                                proto::RegisterReply* reply) {
  PS_RETURN_IF_ERROR(CheckCall(context));
  PS_ASSIGN_OR_RETURN(RegisterArgs args, ReadRegisterRequest(request));
  PS_ASSIGN_OR_RETURN(const WorkerIdentity identity,
                      RegistrantIdentity(request.worker_id(), options_.client_certificates,
                                         options_.client_certificates
                                             ? PeerCertificateNamesOf(context)
                                             : PeerCertificateNames(),
                                         request.identity_proof(), options_.liveness_timeout));
  PS_ASSIGN_OR_RETURN(ParameterServer::Registration reg,
                      server_->Register(request.worker_id(), args.signature, args.requested_rank,
                                        request.steps_per_epoch(), identity));
  FillRegisterReply(*server_, reg, options_.shrinks, reply);
  reply->set_identity(IdentityKind(identity));
  if (options_.job_run != nullptr) reply->set_job_run(options_.job_run->Adopt(args.job_run));
  // Room for a push and a pull of every parameter, and a page.
  shared_memory_.Register(request, reg.rank, reg.session, 8 * server_->num_parameters() + 4096,
                          reply);
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* ParameterServerService::Register(grpc::CallbackServerContext* context,
                                                           const grpc::ByteBuffer* request,
                                                           grpc::ByteBuffer* reply) {
  absl::Status status;
  grpc::ServerUnaryReactor* reactor = AnswerAtOnce<proto::RegisterRequest, proto::RegisterReply>(
      context, *request, reply, "register request", CheckCall(*context),
      [&](const proto::RegisterRequest& message, proto::RegisterReply* answer) {
        absl::Status registered = DoRegister(*context, message, answer);
        if (registered.GetPayload(kLiveWorkerPayload).has_value()) {
          context->AddTrailingMetadata(proto::kRetryRegisterMetadataKey, "live worker");
        }
        return registered;
      },
      &status);
  Answered("Register", status);
  // Adopting the signature may complete version 0 (a server given values).
  if (status.ok()) waiting_->AnswerReady({});
  return reactor;
}

absl::Status ParameterServerService::DoInitialize(const grpc::ServerContextBase& context,
                                                  const grpc::ByteBuffer& request,
                                                  std::vector<ChunkId>* sent) {
  PS_RETURN_IF_ERROR(CheckCall(context));
  proto::InitializeRequest header;
  PS_ASSIGN_OR_RETURN(proto::FrameReader frame,
                      proto::FrameReader::Open(request, "initial parameters", &header));
  PS_RETURN_IF_ERROR(frame.Split(header.chunks()));
  PS_RETURN_IF_ERROR(server_->CheckSession(header.rank(), SessionOf(context)));
  DecodedChunks decoded;
  PS_ASSIGN_OR_RETURN(
      std::vector<ParameterServer::ChunkBytes> chunks,
      DecodeReceivedChunks(
          Received(*server_, ChunkSource::kInitialValues, "initial value", nullptr),
          header.chunks(), frame, &decoded));
  *sent = IdsOf(chunks);
  return server_->InitializeChunkBytes(header.rank(), chunks);
}

grpc::ServerUnaryReactor* ParameterServerService::Initialize(grpc::CallbackServerContext* context,
                                                             const grpc::ByteBuffer* request,
                                                             grpc::ByteBuffer* reply) {
  std::vector<ChunkId> sent;
  const absl::Status status = Answered("Initialize", DoInitialize(*context, *request, &sent));
  grpc::ServerUnaryReactor* reactor = FinishWithoutData(context, status, reply);
  // The reply is on its way; then the pulls this call made ready.
  if (status.ok()) waiting_->AnswerReady(sent);
  return reactor;
}

absl::Status ParameterServerService::DoPush(const grpc::ServerContextBase& context,
                                            const grpc::ByteBuffer& request,
                                            std::vector<ChunkId>* sent, proto::PushReply* reply,
                                            std::optional<PacedReplies::Push>* paced) {
  PS_RETURN_IF_ERROR(CheckCall(context));
  proto::PushRequest header;
  PS_ASSIGN_OR_RETURN(proto::FrameReader frame, proto::FrameReader::Open(request, "push", &header));
  DecodedChunks decoded;
  PS_RETURN_IF_ERROR(frame.Split(header.chunks()));
  // The session first: nothing is decoded or copied for a caller that is not
  // the rank it claims.
  PS_RETURN_IF_ERROR(server_->CheckSession(header.rank(), SessionOf(context)));
  if (header.based_on_version() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("push claims it was computed from version ",
                                                   header.based_on_version(),
                                                   "; versions start at 0"));
  }
  const std::shared_ptr<SharedMemorySegment> segment =
      shared_memory_.SegmentOf(SessionOf(context));
  PS_ASSIGN_OR_RETURN(
      std::vector<ParameterServer::ChunkBytes> chunks,
      DecodeReceivedChunks(Received(*server_, ChunkSource::kPush, "push", segment.get()),
                           header.chunks(), frame, &decoded));
  *sent = IdsOf(chunks);
  const Consistency& consistency = *server_->options().consistency;
  if (consistency.AppliesEachPush()) {
    PS_ASSIGN_OR_RETURN(const int64_t staleness,
                        server_->ApplyNow(header.rank(), header.based_on_version(),
                                          header.num_samples(), chunks));
    reply->set_staleness(staleness);
    if (options_.on_staleness) options_.on_staleness(staleness);
    return absl::OkStatus();
  }
  PS_RETURN_IF_ERROR(
      server_->PushChunkBytes(header.rank(), header.iteration(), header.num_samples(), chunks));
  if (const std::optional<int64_t> staleness =
          consistency.ReplyStaleness(header.iteration(), header.based_on_version())) {
    reply->set_staleness(*staleness);
    if (options_.on_staleness) options_.on_staleness(*staleness);
  }
  // Announced by the first push of the iteration (this one or earlier); the
  // version may have moved on since, and then the members are past.
  absl::StatusOr<std::vector<int>> members = server_->Members(header.iteration() + 1);
  if (members.ok()) {
    reply->set_members_iteration(header.iteration() + 1);
    for (int member : *members) reply->add_members(member);
  }
  if (options_.max_push_lead_bytes > 0 && consistency.PacesPushes()) {
    PacedReplies::Push& push = paced->emplace();
    push.rank = header.rank();
    push.iteration = header.iteration();
    for (const ParameterServer::ChunkBytes& chunk : chunks) {
      push.elements += server_->ChunkLength(chunk.key, chunk.chunk);
    }
    absl::StatusOr<std::vector<int>> current = server_->Members(header.iteration());
    if (current.ok()) push.members = *std::move(current);
  }
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* ParameterServerService::Push(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request,
                                                       grpc::ByteBuffer* reply) {
  std::vector<ChunkId> sent;
  proto::PushReply push_reply;
  std::optional<PacedReplies::Push> paced;
  const absl::Status status =
      Answered("Push", DoPush(*context, *request, &sent, &push_reply, &paced));
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (status.ok()) *reply = proto::SerializeMessage(push_reply);
  if (status.ok() && paced.has_value()) {
    // Applied already: the pacer only decides when the worker hears so.
    paced_replies_.PaceOrAnswer(*paced, server_->num_parameters(), absl::Now(),
                                [reactor] { reactor->Finish(grpc::Status::OK); });
  } else {
    reactor->Finish(ToGrpcStatus(status));
  }
  // The reply is on its way; then the pulls whose chunks this push applied.
  if (status.ok()) waiting_->AnswerReady(sent);
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::Wait(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request,
                                                       grpc::ByteBuffer* reply) {
  absl::Status status = CheckCall(*context);
  if (status.ok()) status = CheckOptionalSession(*context);
  proto::WaitRequest wait;
  if (status.ok()) status = proto::ParseMessage(*request, "wait request", &wait);
  if (!status.ok()) return FinishAtOnce(context, Answered("Wait", status));
  // A pull of no chunks waits for the server's version.
  proto::PullRequest pull;
  pull.set_version(wait.version());
  pull.set_timeout_ms(wait.timeout_ms());
  return PullOrWait(context, std::move(pull), {}, nullptr, /*wait=*/true, reply);
}

absl::Status ParameterServerService::DoHeartbeat(const grpc::ServerContextBase& context,
                                                 const proto::HeartbeatRequest& request,
                                                 proto::HeartbeatReply* reply) {
  PS_RETURN_IF_ERROR(server_->Heartbeat(request.rank(), SessionOf(context)));
  if (request.phases_size() > 0 || request.steps() > 0) {
    // Bounded: one report per rank, and a handful of phases in each.
    if (request.phases_size() > 64) {
      return absl::InvalidArgumentError(
          absl::StrCat("a heartbeat of ", request.phases_size(), " phases; at most 64"));
    }
    absl::MutexLock lock(&reports_mu_);
    reports_[request.rank()] = request;
  }
  FillHeartbeatReply(server_->progress(), server_->options().clock, options_.stall_report_after,
                     options_.liveness_timeout, reply);
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* ParameterServerService::Heartbeat(grpc::CallbackServerContext* context,
                                                            const grpc::ByteBuffer* request,
                                                            grpc::ByteBuffer* reply) {
  absl::Status status;
  grpc::ServerUnaryReactor* reactor = AnswerAtOnce<proto::HeartbeatRequest, proto::HeartbeatReply>(
      context, *request, reply, "heartbeat request", CheckCall(*context),
      [&](const proto::HeartbeatRequest& message, proto::HeartbeatReply* answer) {
        return DoHeartbeat(*context, message, answer);
      },
      &status);
  Answered("Heartbeat", status);
  return reactor;
}

absl::Status ParameterServerService::AnswerPull(const proto::PullRequest& request,
                                                const std::vector<ParameterServer::ChunkId>& ids,
                                                const SharedMemorySegment* segment,
                                                absl::Time deadline, bool wait,
                                                grpc::ByteBuffer* reply) {
  PS_ASSIGN_OR_RETURN(ParameterServer::ChunkViews views,
                      server_->PullChunkViews(request.version(), deadline, ids, request.exact(),
                                              /*with_previous=*/request.delta() &&
                                                  request.dtype() == proto::DTYPE_F32));
  if (wait) {
    proto::WaitReply answer;
    answer.set_version(views.version);
    *reply = proto::SerializeMessage(answer);
    return absl::OkStatus();
  }
  proto::PullReply header;
  header.set_version(views.version);
  if (server_->options().loss_scale.dynamic) {
    const ParameterServer::LossScale scale = server_->loss_scale();
    header.set_loss_scale(scale.scale);
    header.set_loss_scale_version(scale.version);
  }
  PS_ASSIGN_OR_RETURN(const std::vector<grpc::Slice> data,
                      EncodePulledChunks(request, ids, views, segment, &header));
  *reply = proto::MakeFrame(header, data);
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* ParameterServerService::Pull(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request,
                                                       grpc::ByteBuffer* reply) {
  auto refuse = [&](const absl::Status& s) { return FinishAtOnce(context, Answered("Pull", s)); };
  if (absl::Status s = CheckCall(*context); !s.ok()) return refuse(s);
  if (absl::Status s = CheckOptionalSession(*context); !s.ok()) return refuse(s);
  proto::PullRequest pull;
  if (absl::Status s = proto::ParseMessage(*request, "pull request", &pull); !s.ok()) {
    return refuse(s);
  }
  if (absl::Status s = PullCodingFor(pull.dtype()).status(); !s.ok()) return refuse(s);
  std::shared_ptr<SharedMemorySegment> segment;
  if (pull.shared_memory()) {
    segment = shared_memory_.SegmentOf(SessionOf(*context));
    if (absl::Status s = CheckPullIntoSharedMemory(segment.get(), pull); !s.ok()) return refuse(s);
  }
  // Size the reply first: every chunk must exist, and the reply must stay
  // within one message's bound.
  absl::StatusOr<std::vector<ChunkId>> ids = PulledChunkIds(
      pull, server_->options().chunk_elements, ChunkLengths(*server_), segment.get());
  if (!ids.ok()) return refuse(ids.status());
  return PullOrWait(context, std::move(pull), *std::move(ids), std::move(segment),
                    /*wait=*/false, reply);
}

grpc::ServerUnaryReactor* ParameterServerService::PullOrWait(
    grpc::CallbackServerContext* context, proto::PullRequest pull, std::vector<ChunkId> ids,
    std::shared_ptr<SharedMemorySegment> segment, bool wait, grpc::ByteBuffer* reply) {
  const absl::Time deadline =
      WaitDeadline(absl::Now(), pull.timeout_ms(), absl::FromChrono(context->deadline()));
  if (deadline <= absl::Now() || server_->HasChunks(pull.version(), ids)) {
    // The common case (after Wait, or once these chunks are applied), or
    // no time to wait: answered on gRPC's thread.
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(ToGrpcStatus(
        Answered(wait ? "Wait" : "Pull",
                 AnswerPull(pull, ids, segment.get(), deadline, wait, reply))));
    return reactor;
  }
  // It would wait: recorded, pinning no thread (see the class comment).
  // Past its deadline, PullChunkViews answers at once: with the chunks if
  // they exist by now, else with the DEADLINE_EXCEEDED naming one missing.
  const int64_t version = pull.version();
  auto answer = [this, pull = std::move(pull), segment = std::move(segment), wait,
                 reply](const std::vector<ChunkId>& ids) {
    return Answered(wait ? "Wait" : "Pull",
                    AnswerPull(pull, ids, segment.get(), absl::InfinitePast(), wait, reply));
  };
  auto* waiting = new internal::WaitingPullCall(waiting_, version, std::move(ids), deadline,
                                                std::move(answer));
  waiting_->File(waiting);
  return waiting;
}

grpc::ServerUnaryReactor* ParameterServerService::Restore(grpc::CallbackServerContext* context,
                                                          const grpc::ByteBuffer* request,
                                                          grpc::ByteBuffer* reply) {
  proto::RestoreRequest message;
  absl::Status status = CheckCall(*context);
  if (status.ok()) status = proto::ParseMessage(*request, "restore request", &message);
  bool forward = false;
  if (status.ok()) {
    absl::StatusOr<bool> checked = CheckRestoreRequest(*server_, SessionOf(*context), message,
                                                       static_cast<bool>(options_.restore));
    status = checked.status();
    forward = checked.ok() && *checked;
  }
  if (!status.ok() || !forward) {
    proto::RestoreReply answer;
    answer.set_version(message.version());
    if (status.ok()) *reply = proto::SerializeMessage(answer);
    Answered("Restore", status);
    return FinishAtOnce(context, status);
  }
  // The owner decides on another thread (it waits for a checkpoint write
  // in progress); the reactor is finished from there.
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const int64_t version = message.version();
  options_.restore(version, [this, reactor, reply, version](absl::Status decided) {
    if (decided.ok()) {
      proto::RestoreReply answer;
      answer.set_version(version);
      *reply = proto::SerializeMessage(answer);
    }
    Answered("Restore", decided);
    reactor->Finish(ToGrpcStatus(decided));
  });
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::Describe(grpc::CallbackServerContext* context,
                                                           const grpc::ByteBuffer* request,
                                                           grpc::ByteBuffer* reply) {
  absl::Status status;
  grpc::ServerUnaryReactor* reactor = AnswerAtOnce<proto::DescribeRequest, proto::DescribeReply>(
      context, *request, reply, "describe request", CheckCall(*context),
      [&](const proto::DescribeRequest&, proto::DescribeReply* answer) {
        DescribeJob(*server_, options_.shrinks, answer);
        return absl::OkStatus();
      },
      &status);
  Answered("Describe", status);
  return reactor;
}

}  // namespace ps::server
