#include "server/grpc_service.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "proto/wire_format.h"

namespace ps::server {
namespace {

// Waits are capped so a hostile timeout cannot pin a thread for ever.
constexpr int64_t kMaxWaitMs = 3600 * 1000;

absl::Time WaitDeadline(const grpc::ServerContextBase* context, int64_t timeout_ms) {
  const int64_t ms = std::clamp<int64_t>(timeout_ms, 0, kMaxWaitMs);
  absl::Time deadline = absl::Now() + absl::Milliseconds(ms);
  // Never wait past the client's own deadline: nobody would hear the answer.
  const absl::Time client = absl::FromChrono(context->deadline());
  return std::min(deadline, client);
}

// Finishes a call whose reply carries no data (Push and Initialize): one
// empty message when it succeeded.
grpc::ServerUnaryReactor* FinishWithoutData(grpc::CallbackServerContext* context,
                                            const absl::Status& status, grpc::ByteBuffer* reply) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (status.ok()) {
    grpc::Slice empty;
    *reply = grpc::ByteBuffer(&empty, 1);
  }
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// The F32 chunks of a frame's header, over the frame's data pieces (read in
// place; `frame` must outlive them).
absl::StatusOr<std::vector<ParameterServer::ChunkBytes>> ChunksOf(
    const google::protobuf::RepeatedPtrField<proto::TensorChunk>& header_chunks,
    const proto::FrameReader& frame, const char* what) {
  std::vector<ParameterServer::ChunkBytes> chunks;
  chunks.reserve(header_chunks.size());
  for (int c = 0; c < header_chunks.size(); ++c) {
    const proto::TensorChunk& chunk = header_chunks[c];
    if (chunk.dtype() != proto::DTYPE_F32) {
      return absl::InvalidArgumentError(absl::StrCat(what, " of key ", chunk.key(), " has dtype ",
                                                     chunk.dtype(), "; only F32 is supported"));
    }
    if (chunk.data_bytes() % sizeof(float) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " of key ", chunk.key(), " chunk ", chunk.chunk(), " carries ",
                       chunk.data_bytes(), " bytes, not a whole number of F32 elements"));
    }
    chunks.push_back({chunk.key(), chunk.chunk(), frame.pieces(c)});
  }
  return chunks;
}

void ReleaseVersion(void* keep_alive) { delete static_cast<std::shared_ptr<const void>*>(keep_alive); }

}  // namespace

ParameterServerService::~ParameterServerService() {
  std::list<Waiter> waiters;
  {
    absl::MutexLock lock(&waiters_mu_);
    waiters.swap(waiters_);
  }
  for (Waiter& w : waiters) w.thread.join();
}

grpc::Status ParameterServerService::Register(grpc::ServerContext*,
                                              const proto::RegisterRequest* request,
                                              proto::RegisterReply* reply) {
  std::vector<ParamSpec> signature;
  for (const proto::TensorSpec& t : request->signature()) {
    if (t.dtype() != proto::DTYPE_F32) {
      return ToGrpcStatus(absl::InvalidArgumentError(
          absl::StrCat("parameter '", t.name(), "' has dtype ", t.dtype(),
                       "; only F32 parameters are supported")));
    }
    ParamSpec spec;
    spec.name = t.name();
    for (int64_t d : t.shape()) {
      if (d < 0) {
        return ToGrpcStatus(absl::InvalidArgumentError(
            absl::StrCat("parameter '", t.name(), "' has a negative dimension")));
      }
      spec.shape.push_back(d);
    }
    signature.push_back(std::move(spec));
  }
  const int requested_rank = request->has_requested_rank() ? request->requested_rank() : -1;
  if (request->has_requested_rank() && requested_rank < 0) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("requested rank ", requested_rank, " is negative")));
  }
  auto reg = server_->Register(request->worker_id(), signature, requested_rank,
                               request->steps_per_epoch());
  if (!reg.ok()) return ToGrpcStatus(reg.status());
  reply->set_rank(reg->rank);
  reply->set_num_workers(reg->num_workers);
  reply->set_version(reg->version);
  reply->set_chunk_elements(reg->chunk_elements);
  reply->set_send_initial_parameters(reg->send_initial_parameters);
  return grpc::Status::OK;
}

absl::Status ParameterServerService::DoInitialize(const grpc::ByteBuffer& request) {
  proto::InitializeRequest header;
  PS_ASSIGN_OR_RETURN(proto::FrameReader frame,
                      proto::FrameReader::Open(request, "initial parameters", &header));
  PS_RETURN_IF_ERROR(frame.Split(header.chunks()));
  PS_ASSIGN_OR_RETURN(std::vector<ParameterServer::ChunkBytes> chunks,
                      ChunksOf(header.chunks(), frame, "initial value"));
  return server_->InitializeChunkBytes(header.rank(), chunks);
}

grpc::ServerUnaryReactor* ParameterServerService::Initialize(grpc::CallbackServerContext* context,
                                                             const grpc::ByteBuffer* request,
                                                             grpc::ByteBuffer* reply) {
  return FinishWithoutData(context, DoInitialize(*request), reply);
}

absl::Status ParameterServerService::DoPush(const grpc::ByteBuffer& request) {
  proto::PushRequest header;
  PS_ASSIGN_OR_RETURN(proto::FrameReader frame, proto::FrameReader::Open(request, "push", &header));
  PS_RETURN_IF_ERROR(frame.Split(header.chunks()));
  PS_ASSIGN_OR_RETURN(std::vector<ParameterServer::ChunkBytes> chunks,
                      ChunksOf(header.chunks(), frame, "push"));
  return server_->PushChunkBytes(header.rank(), header.iteration(), header.num_samples(), chunks);
}

grpc::ServerUnaryReactor* ParameterServerService::Push(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request,
                                                       grpc::ByteBuffer* reply) {
  return FinishWithoutData(context, DoPush(*request), reply);
}

grpc::Status ParameterServerService::Wait(grpc::ServerContext* context,
                                          const proto::WaitRequest* request,
                                          proto::WaitReply* reply) {
  const absl::Time deadline = WaitDeadline(context, request->timeout_ms());
  auto version = server_->WaitForVersion(request->version(), deadline);
  if (!version.ok()) return ToGrpcStatus(version.status());
  reply->set_version(*version);
  return grpc::Status::OK;
}

absl::Status ParameterServerService::AnswerPull(const proto::PullRequest& request,
                                                const std::vector<ParameterServer::ChunkId>& ids,
                                                absl::Time deadline, grpc::ByteBuffer* reply) {
  PS_ASSIGN_OR_RETURN(ParameterServer::ChunkViews views,
                      server_->PullChunkViews(request.version(), deadline, ids));
  proto::PullReply header;
  header.set_version(views.version);
  std::vector<grpc::Slice> data;
  data.reserve(ids.size());
  for (size_t c = 0; c < ids.size(); ++c) {
    const absl::Span<const float> view = views.chunks[c];
    proto::TensorChunk* chunk = header.add_chunks();
    chunk->set_key(ids[c].key);
    chunk->set_chunk(ids[c].chunk);
    chunk->set_dtype(proto::DTYPE_F32);
    chunk->set_data_bytes(static_cast<int64_t>(view.size() * sizeof(float)));
    // Each slice keeps the viewed chunks alive, and unchanged, until gRPC
    // has sent it.
    data.push_back(proto::BorrowedSlice(view.data(), view.size() * sizeof(float), &ReleaseVersion,
                                        new std::shared_ptr<const void>(views.keep_alive)));
  }
  *reply = proto::MakeFrame(header, data);
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* ParameterServerService::Pull(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request,
                                                       grpc::ByteBuffer* reply) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  proto::PullRequest pull;
  if (absl::Status s = proto::ParseMessage(*request, "pull request", &pull); !s.ok()) {
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }
  // Size the reply first: every chunk must exist, and the reply must stay
  // within one message's bound.
  const int64_t max_elements = server_->options().chunk_elements;
  int64_t total = 0;
  std::vector<ParameterServer::ChunkId> ids;
  ids.reserve(pull.chunks_size());
  for (const proto::ChunkId& id : pull.chunks()) {
    const int64_t length = server_->ChunkLength(id.key(), id.chunk());
    if (length < 0) {
      reactor->Finish(ToGrpcStatus(absl::OutOfRangeError(
          absl::StrCat("chunk ", id.chunk(), " of key ", id.key(), " out of range"))));
      return reactor;
    }
    total += length;
    if (total > max_elements) {
      reactor->Finish(ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat(
          "pull asks for more than ", max_elements, " elements in one message; split it"))));
      return reactor;
    }
    ids.push_back({id.key(), id.chunk()});
  }
  const absl::Time deadline = WaitDeadline(context, pull.timeout_ms());
  if (server_->HasChunks(pull.version(), ids)) {
    // The common case (after Wait, or once these chunks are applied): no
    // waiting, answered on gRPC's thread.
    reactor->Finish(ToGrpcStatus(AnswerPull(pull, ids, deadline, reply)));
    return reactor;
  }
  // It would wait: not on gRPC's thread.
  absl::MutexLock lock(&waiters_mu_);
  int waiting = 0;
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (it->done) {
      it->thread.join();
      it = waiters_.erase(it);
    } else {
      ++waiting;
      ++it;
    }
  }
  if (waiting >= kMaxWaitingPulls) {
    reactor->Finish(ToGrpcStatus(absl::ResourceExhaustedError(
        absl::StrCat(waiting, " pulls already wait for a version; try again later"))));
    return reactor;
  }
  auto waiter = waiters_.emplace(waiters_.end());
  waiter->thread = std::thread([this, reactor, reply, waiter, deadline, pull = std::move(pull),
                                ids = std::move(ids)] {
    reactor->Finish(ToGrpcStatus(AnswerPull(pull, ids, deadline, reply)));
    absl::MutexLock lock(&waiters_mu_);
    waiter->done = true;
  });
  return reactor;
}

}  // namespace ps::server
