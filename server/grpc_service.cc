#include "server/grpc_service.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"

namespace ps::server {
namespace {

// Waits are capped so a hostile timeout cannot pin a thread for ever.
constexpr int64_t kMaxWaitMs = 3600 * 1000;

absl::Time WaitDeadline(grpc::ServerContext* context, int64_t timeout_ms) {
  const int64_t ms = std::clamp<int64_t>(timeout_ms, 0, kMaxWaitMs);
  absl::Time deadline = absl::Now() + absl::Milliseconds(ms);
  // Never wait past the client's own deadline: nobody would hear the answer.
  const absl::Time client = absl::FromChrono(context->deadline());
  return std::min(deadline, client);
}

// Views the F32 chunks of a message as domain chunks, reading the floats in
// place. `aligned_copies` holds copies of any bytes field that is not 4-byte
// aligned (a parsed bytes field lives in a malloc-aligned heap block, so in
// practice none); it must outlive the returned views.
absl::StatusOr<std::vector<ParameterServer::ChunkData>> ViewChunks(
    const google::protobuf::RepeatedPtrField<proto::TensorChunk>& message_chunks,
    const char* what, std::vector<std::vector<float>>* aligned_copies) {
  std::vector<ParameterServer::ChunkData> chunks;
  chunks.reserve(message_chunks.size());
  for (const proto::TensorChunk& chunk : message_chunks) {
    if (chunk.dtype() != proto::DTYPE_F32) {
      return absl::InvalidArgumentError(absl::StrCat(what, " of key ", chunk.key(), " has dtype ",
                                                     chunk.dtype(), "; only F32 is supported"));
    }
    const std::string& data = chunk.data();
    if (data.size() % sizeof(float) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " of key ", chunk.key(), " chunk ", chunk.chunk(), " carries ",
                       data.size(), " bytes, not a whole number of F32 elements"));
    }
    // The bytes are little-endian F32, as on every machine we run on.
    const int64_t n = static_cast<int64_t>(data.size() / sizeof(float));
    const float* floats = reinterpret_cast<const float*>(data.data());
    if (reinterpret_cast<uintptr_t>(floats) % alignof(float) != 0) {
      aligned_copies->emplace_back(n);
      std::memcpy(aligned_copies->back().data(), data.data(), data.size());
      floats = aligned_copies->back().data();
    }
    chunks.push_back({chunk.key(), chunk.chunk(), absl::MakeConstSpan(floats, n)});
  }
  return chunks;
}

}  // namespace

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

grpc::Status ParameterServerService::Initialize(grpc::ServerContext*,
                                                const proto::InitializeRequest* request,
                                                proto::InitializeReply*) {
  std::vector<std::vector<float>> aligned_copies;
  auto chunks = ViewChunks(request->chunks(), "initial value", &aligned_copies);
  if (!chunks.ok()) return ToGrpcStatus(chunks.status());
  return ToGrpcStatus(server_->InitializeChunks(request->rank(), *chunks));
}

grpc::Status ParameterServerService::Push(grpc::ServerContext*, const proto::PushRequest* request,
                                          proto::PushReply*) {
  std::vector<std::vector<float>> aligned_copies;
  auto chunks = ViewChunks(request->chunks(), "push", &aligned_copies);
  if (!chunks.ok()) return ToGrpcStatus(chunks.status());
  return ToGrpcStatus(server_->PushChunks(request->rank(), request->iteration(),
                                          request->num_samples(), *chunks));
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

grpc::Status ParameterServerService::Pull(grpc::ServerContext* context,
                                          const proto::PullRequest* request,
                                          proto::PullReply* reply) {
  // Size the reply first: every chunk must exist, and the reply must stay
  // within one message's bound.
  const int64_t max_elements = server_->options().chunk_elements;
  int64_t total = 0;
  std::vector<ParameterServer::ChunkOut> outs;
  outs.reserve(request->chunks_size());
  for (const proto::ChunkId& id : request->chunks()) {
    const int64_t length = server_->ChunkLength(id.key(), id.chunk());
    if (length < 0) {
      return ToGrpcStatus(absl::OutOfRangeError(
          absl::StrCat("chunk ", id.chunk(), " of key ", id.key(), " out of range")));
    }
    total += length;
    if (total > max_elements) {
      return ToGrpcStatus(absl::InvalidArgumentError(
          absl::StrCat("pull asks for more than ", max_elements,
                       " elements in one message; split it")));
    }
    proto::TensorChunk* chunk = reply->add_chunks();
    chunk->set_key(id.key());
    chunk->set_chunk(id.chunk());
    chunk->set_dtype(proto::DTYPE_F32);
    std::string* data = chunk->mutable_data();
    data->resize(length * sizeof(float));
    outs.push_back({id.key(), id.chunk(),
                    absl::MakeSpan(reinterpret_cast<float*>(data->data()), length)});
  }
  auto version = server_->PullChunks(request->version(),
                                     WaitDeadline(context, request->timeout_ms()), outs);
  if (!version.ok()) {
    reply->Clear();
    return ToGrpcStatus(version.status());
  }
  reply->set_version(*version);
  return grpc::Status::OK;
}

}  // namespace ps::server
