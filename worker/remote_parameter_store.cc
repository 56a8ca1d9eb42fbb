#include "worker/remote_parameter_store.h"

#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"

namespace ps::worker {
namespace {

std::chrono::system_clock::time_point DeadlineAfter(absl::Duration d) {
  return absl::ToChronoTime(absl::Now() + d);
}

// Counts outstanding callback RPCs and keeps the first failure.
class CallGroup {
 public:
  explicit CallGroup(int64_t calls) : pending_(calls) {}

  void Done(const absl::Status& status) {
    absl::MutexLock lock(&mu_);
    if (!status.ok() && first_error_.ok()) first_error_ = status;
    --pending_;
  }

  absl::Status Wait() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int64_t* pending) { return *pending == 0; }, &pending_));
    return first_error_;
  }

 private:
  absl::Mutex mu_;
  int64_t pending_ ABSL_GUARDED_BY(mu_);
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

RemoteParameterStore::RemoteParameterStore(const RemoteStoreOptions& options)
    : options_(options) {}

absl::StatusOr<std::unique_ptr<RemoteParameterStore>> RemoteParameterStore::Create(
    const RemoteStoreOptions& options) {
  if (options.server_address.empty()) return absl::InvalidArgumentError("no server address");
  std::unique_ptr<RemoteParameterStore> store(new RemoteParameterStore(options));
  if (store->options_.worker_id.empty()) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    const_cast<RemoteStoreOptions&>(store->options_).worker_id =
        absl::StrCat(host, "-", getpid());
  }
  store->channel_ =
      grpc::CreateChannel(options.server_address, grpc::InsecureChannelCredentials());
  store->stub_ = proto::ParameterServer::NewStub(store->channel_);
  return store;
}

absl::StatusOr<ParameterStore::Registration> RemoteParameterStore::Register(
    const std::vector<ParamSpec>& signature, absl::Span<const float>) {
  proto::RegisterRequest request;
  request.set_worker_id(options_.worker_id);
  if (options_.rank >= 0) request.set_requested_rank(options_.rank);
  for (const ParamSpec& spec : signature) {
    proto::TensorSpec* t = request.add_signature();
    t->set_name(spec.name);
    t->set_dtype(proto::DTYPE_F32);
    for (int64_t d : spec.shape) t->add_shape(d);
  }
  grpc::ClientContext context;
  // The server may still be starting: wait for the channel, within bounds.
  context.set_wait_for_ready(true);
  context.set_deadline(DeadlineAfter(options_.connect_timeout));
  proto::RegisterReply reply;
  PS_RETURN_IF_ERROR(FromGrpcStatus(stub_->Register(&context, request, &reply),
                                    absl::StrCat("Register with ", options_.server_address)));
  if (reply.chunk_elements() < 1 || reply.num_workers() < 1 || reply.rank() < 0 ||
      reply.rank() >= reply.num_workers()) {
    return absl::InternalError(absl::StrCat("server ", options_.server_address,
                                            " sent a malformed registration reply"));
  }
  rank_ = reply.rank();
  chunks_.clear();
  int64_t offset = 0;
  for (int key = 0; key < static_cast<int>(signature.size()); ++key) {
    const int64_t n = NumElements(signature[key].shape);
    const int64_t count = ChunkCount(n, reply.chunk_elements());
    for (int64_t c = 0; c < count; ++c) {
      const int64_t begin = c * reply.chunk_elements();
      chunks_.push_back({key, c, offset + begin, std::min(reply.chunk_elements(), n - begin)});
    }
    offset += n;
  }
  num_parameters_ = offset;
  messages_.clear();
  int64_t in_message = 0;
  for (const Chunk& chunk : chunks_) {
    if (messages_.empty() || in_message + chunk.length > reply.chunk_elements()) {
      messages_.emplace_back();
      in_message = 0;
    }
    messages_.back().push_back(chunk);
    in_message += chunk.length;
  }
  Registration out;
  out.rank = reply.rank();
  out.num_workers = reply.num_workers();
  out.version = reply.version();
  return out;
}

absl::Status RemoteParameterStore::Push(int64_t iteration, int64_t num_samples,
                                        absl::Span<const float> gradient) {
  if (rank_ < 0) return absl::FailedPreconditionError("Push before Register");
  if (static_cast<int64_t>(gradient.size()) != num_parameters_) {
    return absl::InvalidArgumentError(absl::StrCat("gradient has ", gradient.size(),
                                                   " elements, the model ", num_parameters_));
  }
  struct Call {
    grpc::ClientContext context;
    proto::PushRequest request;
    proto::PushReply reply;
  };
  std::vector<std::unique_ptr<Call>> calls(messages_.size());
  CallGroup group(static_cast<int64_t>(messages_.size()));
  for (size_t m = 0; m < messages_.size(); ++m) {
    calls[m] = std::make_unique<Call>();
    Call& call = *calls[m];
    call.context.set_deadline(DeadlineAfter(options_.rpc_timeout));
    call.request.set_rank(rank_);
    call.request.set_iteration(iteration);
    call.request.set_num_samples(num_samples);
    for (const Chunk& chunk : messages_[m]) {
      proto::TensorChunk* out = call.request.add_chunks();
      out->set_key(chunk.key);
      out->set_chunk(chunk.index);
      out->set_dtype(proto::DTYPE_F32);
      out->set_data(reinterpret_cast<const char*>(gradient.data() + chunk.offset),
                    chunk.length * sizeof(float));
    }
    const Chunk& first = messages_[m].front();
    stub_->async()->Push(&call.context, &call.request, &call.reply,
                         [&group, &first, this](grpc::Status status) {
                           group.Done(FromGrpcStatus(
                               status, absl::StrCat("Push of key ", first.key, " chunk ",
                                                    first.index, " (and the rest of its "
                                                    "message) to ", options_.server_address)));
                         });
  }
  PS_RETURN_IF_ERROR(group.Wait());
  bytes_pushed_ += num_parameters_ * static_cast<int64_t>(sizeof(float));
  return absl::OkStatus();
}

absl::Status RemoteParameterStore::WaitForVersion(int64_t version) {
  grpc::ClientContext context;
  context.set_deadline(DeadlineAfter(options_.wait_timeout + absl::Seconds(5)));
  proto::WaitRequest request;
  request.set_version(version);
  request.set_timeout_ms(absl::ToInt64Milliseconds(options_.wait_timeout));
  proto::WaitReply reply;
  return FromGrpcStatus(stub_->Wait(&context, request, &reply),
                        absl::StrCat("Wait for version ", version, " at ",
                                     options_.server_address));
}

absl::StatusOr<int64_t> RemoteParameterStore::Pull(int64_t version, absl::Span<float> params) {
  if (rank_ < 0) return absl::FailedPreconditionError("Pull before Register");
  if (static_cast<int64_t>(params.size()) != num_parameters_) {
    return absl::InvalidArgumentError(absl::StrCat("parameter buffer has ", params.size(),
                                                   " elements, the model ", num_parameters_));
  }
  struct Call {
    grpc::ClientContext context;
    proto::PullRequest request;
    proto::PullReply reply;
  };
  std::vector<std::unique_ptr<Call>> calls(messages_.size());
  CallGroup group(static_cast<int64_t>(messages_.size()));
  for (size_t m = 0; m < messages_.size(); ++m) {
    calls[m] = std::make_unique<Call>();
    Call& call = *calls[m];
    call.context.set_deadline(DeadlineAfter(options_.rpc_timeout));
    call.request.set_version(version);
    call.request.set_timeout_ms(absl::ToInt64Milliseconds(options_.rpc_timeout));
    for (const Chunk& chunk : messages_[m]) {
      proto::ChunkId* id = call.request.add_chunks();
      id->set_key(chunk.key);
      id->set_chunk(chunk.index);
    }
    const std::vector<Chunk>& wanted = messages_[m];
    stub_->async()->Pull(
        &call.context, &call.request, &call.reply,
        [&group, &wanted, &call, params, this](grpc::Status status) {
          absl::Status s = FromGrpcStatus(
              status, absl::StrCat("Pull of key ", wanted.front().key, " chunk ",
                                   wanted.front().index, " (and the rest of its message) from ",
                                   options_.server_address));
          if (s.ok() && call.reply.chunks_size() != static_cast<int>(wanted.size())) {
            s = absl::InternalError(absl::StrCat("server sent ", call.reply.chunks_size(),
                                                 " chunks, expected ", wanted.size()));
          }
          for (size_t c = 0; s.ok() && c < wanted.size(); ++c) {
            const proto::TensorChunk& got = call.reply.chunks(static_cast<int>(c));
            const Chunk& chunk = wanted[c];
            if (got.key() != chunk.key || got.chunk() != chunk.index ||
                got.data().size() != static_cast<size_t>(chunk.length) * sizeof(float)) {
              s = absl::InternalError(absl::StrCat(
                  "server sent key ", got.key(), " chunk ", got.chunk(), " with ",
                  got.data().size(), " bytes where key ", chunk.key, " chunk ", chunk.index,
                  " with ", chunk.length * sizeof(float), " bytes was expected"));
              break;
            }
            std::memcpy(params.data() + chunk.offset, got.data().data(), got.data().size());
          }
          group.Done(s);
        });
  }
  PS_RETURN_IF_ERROR(group.Wait());
  // Every message must come from one version, or the parameters would mix two.
  const int64_t got = calls.empty() ? version : calls[0]->reply.version();
  for (const auto& call : calls) {
    if (call->reply.version() != got) {
      return absl::InternalError(absl::StrCat("pull mixed versions ", got, " and ",
                                              call->reply.version()));
    }
  }
  bytes_pulled_ += num_parameters_ * static_cast<int64_t>(sizeof(float));
  return got;
}

}  // namespace ps::worker
