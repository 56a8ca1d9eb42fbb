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
  if (options.clock == nullptr) return absl::InvalidArgumentError("no clock");
  if (options.steps_per_epoch < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("negative steps per epoch ", options.steps_per_epoch));
  }
  std::unique_ptr<RemoteParameterStore> store(new RemoteParameterStore(options));
  if (store->options_.worker_id.empty()) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    store->options_.worker_id = absl::StrCat(host, "-", getpid());
  }
  store->channel_ =
      grpc::CreateChannel(options.server_address, grpc::InsecureChannelCredentials());
  store->stub_ = proto::ParameterServer::NewStub(store->channel_);
  return store;
}

template <typename Request, typename Reply>
absl::Status RemoteParameterStore::CallEveryMessage(
    const char* what, EventKind kind, int64_t step,
    const std::function<void(const Message&, Request*)>& fill,
    const std::function<void(grpc::ClientContext*, const Request*, Reply*,
                             std::function<void(grpc::Status)>)>& start,
    const std::function<absl::Status(const Message&, const Reply&)>& check,
    std::vector<Reply>* replies) {
  struct Call {
    grpc::ClientContext context;
    Request request;
    int64_t start_ns = 0;
  };
  const size_t count = messages_.size();
  std::vector<std::unique_ptr<Call>> calls(count);
  replies->assign(count, Reply());
  CallGroup group(static_cast<int64_t>(count));
  for (size_t m = 0; m < count; ++m) {
    calls[m] = std::make_unique<Call>();
    Call& call = *calls[m];
    call.context.set_deadline(DeadlineAfter(options_.rpc_timeout));
    fill(messages_[m], &call.request);
    if (options_.observer != nullptr) call.start_ns = options_.clock->NowNanos();
    Reply* reply = &(*replies)[m];
    start(&call.context, &call.request, reply, [&, m, reply](grpc::Status status) {
      const Message& message = messages_[m];
      if (options_.observer != nullptr) {
        TimedEvent event;
        event.kind = kind;
        event.lane = RpcLane(static_cast<int>(m));
        event.step = step;
        event.name = key_names_[message.front().key];
        event.start_ns = calls[m]->start_ns;
        event.end_ns = options_.clock->NowNanos();
        event.bytes = message_elements_[m] * static_cast<int64_t>(sizeof(float));
        options_.observer->OnEvent(event);
      }
      absl::Status s = FromGrpcStatus(
          status, absl::StrCat(what, " of key ", message.front().key, " chunk ",
                               message.front().index, " (and the rest of its message) at ",
                               options_.server_address));
      if (s.ok() && check) s = check(message, *reply);
      group.Done(s);
    });
  }
  return group.Wait();
}

void RemoteParameterStore::FillChunks(const Message& message, absl::Span<const float> flat,
                                      google::protobuf::RepeatedPtrField<proto::TensorChunk>* out) {
  for (const Chunk& chunk : message) {
    proto::TensorChunk* t = out->Add();
    t->set_key(chunk.key);
    t->set_chunk(chunk.index);
    t->set_dtype(proto::DTYPE_F32);
    t->set_data(reinterpret_cast<const char*>(flat.data() + chunk.offset),
                chunk.length * sizeof(float));
  }
}

absl::StatusOr<ParameterStore::Registration> RemoteParameterStore::Register(
    const std::vector<ParamSpec>& signature, absl::Span<const float> proposed) {
  proto::RegisterRequest request;
  request.set_worker_id(options_.worker_id);
  if (options_.rank >= 0) request.set_requested_rank(options_.rank);
  request.set_steps_per_epoch(options_.steps_per_epoch);
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
  messages_.clear();
  message_elements_.clear();
  key_names_.clear();
  int64_t offset = 0;
  for (int key = 0; key < static_cast<int>(signature.size()); ++key) {
    key_names_.push_back(signature[key].name);
    const int64_t n = NumElements(signature[key].shape);
    const int64_t count = ChunkCount(n, reply.chunk_elements());
    for (int64_t c = 0; c < count; ++c) {
      const int64_t begin = c * reply.chunk_elements();
      const Chunk chunk{key, c, offset + begin, std::min(reply.chunk_elements(), n - begin)};
      if (messages_.empty() || message_elements_.back() + chunk.length > reply.chunk_elements()) {
        messages_.emplace_back();
        message_elements_.push_back(0);
      }
      messages_.back().push_back(chunk);
      message_elements_.back() += chunk.length;
    }
    offset += n;
  }
  num_parameters_ = offset;
  if (reply.send_initial_parameters()) {
    PS_RETURN_IF_ERROR(SendInitialParameters(proposed));
    sent_initial_parameters_ = true;
  }
  Registration out;
  out.rank = reply.rank();
  out.num_workers = reply.num_workers();
  out.version = reply.version();
  return out;
}

absl::Status RemoteParameterStore::SendInitialParameters(absl::Span<const float> proposed) {
  if (static_cast<int64_t>(proposed.size()) != num_parameters_) {
    return absl::InvalidArgumentError(
        absl::StrCat("the server asks for this worker's initial parameters, but it proposed ",
                     proposed.size(), " elements for a model of ", num_parameters_));
  }
  std::vector<proto::InitializeReply> replies;
  return CallEveryMessage<proto::InitializeRequest, proto::InitializeReply>(
      "Initialize", EventKind::kPushMessage, /*step=*/-1,
      [&](const Message& message, proto::InitializeRequest* request) {
        request->set_rank(rank_);
        FillChunks(message, proposed, request->mutable_chunks());
      },
      [this](grpc::ClientContext* context, const proto::InitializeRequest* request,
             proto::InitializeReply* reply, std::function<void(grpc::Status)> done) {
        stub_->async()->Initialize(context, request, reply, std::move(done));
      },
      {}, &replies);
}

absl::Status RemoteParameterStore::Push(int64_t iteration, int64_t num_samples,
                                        absl::Span<const float> gradient) {
  if (rank_ < 0) return absl::FailedPreconditionError("Push before Register");
  if (static_cast<int64_t>(gradient.size()) != num_parameters_) {
    return absl::InvalidArgumentError(absl::StrCat("gradient has ", gradient.size(),
                                                   " elements, the model ", num_parameters_));
  }
  std::vector<proto::PushReply> replies;
  PS_RETURN_IF_ERROR((CallEveryMessage<proto::PushRequest, proto::PushReply>(
      "Push", EventKind::kPushMessage, iteration,
      [&](const Message& message, proto::PushRequest* request) {
        request->set_rank(rank_);
        request->set_iteration(iteration);
        request->set_num_samples(num_samples);
        FillChunks(message, gradient, request->mutable_chunks());
      },
      [this](grpc::ClientContext* context, const proto::PushRequest* request,
             proto::PushReply* reply, std::function<void(grpc::Status)> done) {
        stub_->async()->Push(context, request, reply, std::move(done));
      },
      {}, &replies)));
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
  std::vector<proto::PullReply> replies;
  PS_RETURN_IF_ERROR((CallEveryMessage<proto::PullRequest, proto::PullReply>(
      "Pull", EventKind::kPullMessage, version - 1,
      [&](const Message& message, proto::PullRequest* request) {
        request->set_version(version);
        request->set_timeout_ms(absl::ToInt64Milliseconds(options_.rpc_timeout));
        for (const Chunk& chunk : message) {
          proto::ChunkId* id = request->add_chunks();
          id->set_key(chunk.key);
          id->set_chunk(chunk.index);
        }
      },
      [this](grpc::ClientContext* context, const proto::PullRequest* request,
             proto::PullReply* reply, std::function<void(grpc::Status)> done) {
        stub_->async()->Pull(context, request, reply, std::move(done));
      },
      // Each reply is checked and copied out on its completion thread, while
      // the other messages are still in flight.
      [params](const Message& wanted, const proto::PullReply& reply) -> absl::Status {
        if (reply.chunks_size() != static_cast<int>(wanted.size())) {
          return absl::InternalError(absl::StrCat("server sent ", reply.chunks_size(),
                                                  " chunks, expected ", wanted.size()));
        }
        for (size_t c = 0; c < wanted.size(); ++c) {
          const proto::TensorChunk& got = reply.chunks(static_cast<int>(c));
          const Chunk& chunk = wanted[c];
          if (got.key() != chunk.key || got.chunk() != chunk.index ||
              got.data().size() != static_cast<size_t>(chunk.length) * sizeof(float)) {
            return absl::InternalError(absl::StrCat(
                "server sent key ", got.key(), " chunk ", got.chunk(), " with ",
                got.data().size(), " bytes where key ", chunk.key, " chunk ", chunk.index,
                " with ", chunk.length * sizeof(float), " bytes was expected"));
          }
          std::memcpy(params.data() + chunk.offset, got.data().data(), got.data().size());
        }
        return absl::OkStatus();
      },
      &replies)));
  // Every message must come from one version, or the parameters would mix two.
  const int64_t got = replies.empty() ? version : replies[0].version();
  for (const proto::PullReply& reply : replies) {
    if (reply.version() != got) {
      return absl::InternalError(
          absl::StrCat("pull mixed versions ", got, " and ", reply.version()));
    }
  }
  bytes_pulled_ += num_parameters_ * static_cast<int64_t>(sizeof(float));
  return got;
}

}  // namespace ps::worker
