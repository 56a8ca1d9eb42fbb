#ifndef PS_SERVER_GRPC_ANSWERS_H_
#define PS_SERVER_GRPC_ANSWERS_H_

// How the gRPC service reads a call's metadata and finishes a unary call
// on gRPC's own thread (callback API, default reactor): the glue every
// method of server/grpc_service.h shares.

#include <utility>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/grpc_status.h"
#include "proto/wire_format.h"

namespace ps::server {

// Finishes a call at once on gRPC's thread with its default reactor.
inline grpc::ServerUnaryReactor* FinishAtOnce(grpc::CallbackServerContext* context,
                                              const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// Finishes a call whose reply carries no data (Push and Initialize): one
// empty message when it succeeded.
inline grpc::ServerUnaryReactor* FinishWithoutData(grpc::CallbackServerContext* context,
                                                   const absl::Status& status,
                                                   grpc::ByteBuffer* reply) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (status.ok()) {
    grpc::Slice empty;
    *reply = grpc::ByteBuffer(&empty, 1);
  }
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// The value of metadata `key` on a call ("" when absent).
inline absl::string_view MetadataOf(const grpc::ServerContextBase& context,
                                    absl::string_view key) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(grpc::string_ref(key.data(), key.size()));
  if (it == metadata.end()) return {};
  return absl::string_view(it->second.data(), it->second.size());
}

// A plain protobuf method answered at once: the call's checks, the request
// parsed (INVALID_ARGUMENT naming `what` if it does not parse), `handle`,
// and its reply serialized when it succeeded. Returns the call's (default)
// reactor, finished, and the status it finished with in *status.
template <typename Request, typename Reply, typename Handle>
grpc::ServerUnaryReactor* AnswerAtOnce(grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer& request, grpc::ByteBuffer* reply,
                                       const char* what, absl::Status checked,
                                       const Handle& handle, absl::Status* status) {
  Request message;
  *status = std::move(checked);
  if (status->ok()) *status = proto::ParseMessage(request, what, &message);
  Reply answer;
  if (status->ok()) *status = handle(message, &answer);
  if (status->ok()) *reply = proto::SerializeMessage(answer);
  return FinishAtOnce(context, *status);
}

}  // namespace ps::server

#endif  // PS_SERVER_GRPC_ANSWERS_H_
