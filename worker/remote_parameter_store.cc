#include "worker/remote_parameter_store.h"

#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "proto/wire_format.h"
#include "server/f32_pieces.h"

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

// Counts the slices gRPC holds into a buffer the store lent it. Shared by
// the lender and every slice, so the last to let go frees it, whichever
// thread that is.
class Loans {
 public:
  static grpc::Slice Lend(const std::shared_ptr<Loans>& loans, const void* bytes, size_t size) {
    {
      absl::MutexLock lock(&loans->mu_);
      ++loans->outstanding_;
    }
    return proto::BorrowedSlice(bytes, size, &Return, new std::shared_ptr<Loans>(loans));
  }

  // Blocks until every lent slice is back.
  void AwaitReturns() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int64_t* outstanding) { return *outstanding == 0; }, &outstanding_));
  }

 private:
  static void Return(void* arg) {
    auto* loans = static_cast<std::shared_ptr<Loans>*>(arg);
    {
      absl::MutexLock lock(&(*loans)->mu_);
      --(*loans)->outstanding_;
    }
    delete loans;
  }

  absl::Mutex mu_;
  int64_t outstanding_ ABSL_GUARDED_BY(mu_) = 0;
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
  store->raw_stub_ = std::make_unique<grpc::GenericStub>(store->channel_);
  return store;
}

absl::Status RemoteParameterStore::CallEveryMessage(
    const char* what, const char* method, EventKind kind, int64_t step,
    const std::function<grpc::ByteBuffer(size_t)>& fill,
    const std::function<absl::Status(size_t, const grpc::ByteBuffer&)>& check) {
  struct Call {
    grpc::ClientContext context;
    grpc::ByteBuffer request;
    grpc::ByteBuffer reply;
    int64_t start_ns = 0;
  };
  const size_t count = messages_.size();
  std::vector<std::unique_ptr<Call>> calls(count);
  CallGroup group(static_cast<int64_t>(count));
  for (size_t m = 0; m < count; ++m) {
    calls[m] = std::make_unique<Call>();
    Call& call = *calls[m];
    call.context.set_deadline(DeadlineAfter(options_.rpc_timeout));
    call.request = fill(m);
    if (options_.observer != nullptr) call.start_ns = options_.clock->NowNanos();
    raw_stub_->UnaryCall(
        &call.context, method, grpc::StubOptions(), &call.request, &call.reply,
        [&, m](grpc::Status status) {
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
          if (s.ok() && check) s = check(m, calls[m]->reply);
          group.Done(s);
        });
  }
  return group.Wait();
}

template <typename Header>
absl::Status RemoteParameterStore::SendFrames(const char* what, const char* method, int64_t step,
                                              absl::Span<const float> flat,
                                              const std::function<void(Header*)>& header) {
  auto loans = std::make_shared<Loans>();
  const absl::Status status = CallEveryMessage(
      what, method, EventKind::kPushMessage, step,
      [&](size_t m) {
        Header h;
        header(&h);
        std::vector<grpc::Slice> data;
        data.reserve(messages_[m].size());
        for (const Chunk& chunk : messages_[m]) {
          proto::TensorChunk* t = h.add_chunks();
          t->set_key(chunk.key);
          t->set_chunk(chunk.index);
          t->set_dtype(proto::DTYPE_F32);
          const size_t bytes = static_cast<size_t>(chunk.length) * sizeof(float);
          t->set_data_bytes(static_cast<int64_t>(bytes));
          data.push_back(Loans::Lend(loans, flat.data() + chunk.offset, bytes));
        }
        return proto::MakeFrame(h, data);
      },
      {});
  // The calls (and their requests) are gone; gRPC drops its own references
  // once it has written the bytes, which every reply implies, or cancelled.
  loans->AwaitReturns();
  return status;
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
  return SendFrames<proto::InitializeRequest>(
      "Initialize", proto::kInitializeMethod, /*step=*/-1, proposed,
      [this](proto::InitializeRequest* header) { header->set_rank(rank_); });
}

absl::Status RemoteParameterStore::Push(int64_t iteration, int64_t num_samples,
                                        absl::Span<const float> gradient) {
  if (rank_ < 0) return absl::FailedPreconditionError("Push before Register");
  if (static_cast<int64_t>(gradient.size()) != num_parameters_) {
    return absl::InvalidArgumentError(absl::StrCat("gradient has ", gradient.size(),
                                                   " elements, the model ", num_parameters_));
  }
  PS_RETURN_IF_ERROR(SendFrames<proto::PushRequest>(
      "Push", proto::kPushMethod, iteration, gradient, [&](proto::PushRequest* header) {
        header->set_rank(rank_);
        header->set_iteration(iteration);
        header->set_num_samples(num_samples);
      }));
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
  std::vector<int64_t> versions(messages_.size(), version);
  PS_RETURN_IF_ERROR(CallEveryMessage(
      "Pull", proto::kPullMethod, EventKind::kPullMessage, version - 1,
      [&](size_t m) {
        proto::PullRequest request;
        request.set_version(version);
        request.set_timeout_ms(absl::ToInt64Milliseconds(options_.rpc_timeout));
        for (const Chunk& chunk : messages_[m]) {
          proto::ChunkId* id = request.add_chunks();
          id->set_key(chunk.key);
          id->set_chunk(chunk.index);
        }
        return proto::SerializeMessage(request);
      },
      // Each reply is checked and copied out of gRPC's receive buffers
      // straight into `params` on its completion thread, while the other
      // messages are still in flight.
      [&](size_t m, const grpc::ByteBuffer& frame) -> absl::Status {
        const Message& wanted = messages_[m];
        proto::PullReply reply;
        auto reader = proto::FrameReader::Open(frame, "pull reply", &reply);
        absl::Status s = reader.ok() ? reader->Split(reply.chunks()) : reader.status();
        if (!s.ok()) return absl::InternalError(absl::StrCat("server sent a ", s.message()));
        if (reply.chunks_size() != static_cast<int>(wanted.size())) {
          return absl::InternalError(absl::StrCat("server sent ", reply.chunks_size(),
                                                  " chunks, expected ", wanted.size()));
        }
        for (size_t c = 0; c < wanted.size(); ++c) {
          const proto::TensorChunk& got = reply.chunks(static_cast<int>(c));
          const Chunk& chunk = wanted[c];
          if (got.key() != chunk.key || got.chunk() != chunk.index ||
              got.data_bytes() != chunk.length * static_cast<int64_t>(sizeof(float))) {
            return absl::InternalError(absl::StrCat(
                "server sent key ", got.key(), " chunk ", got.chunk(), " with ",
                got.data_bytes(), " bytes where key ", chunk.key, " chunk ", chunk.index,
                " with ", chunk.length * sizeof(float), " bytes was expected"));
          }
          server::CopyPiecesTo(reader->pieces(c), params.data() + chunk.offset);
        }
        versions[m] = reply.version();
        return absl::OkStatus();
      }));
  // Every message must come from one version, or the parameters would mix two.
  const int64_t got = versions.empty() ? version : versions[0];
  for (int64_t v : versions) {
    if (v != got) return absl::InternalError(absl::StrCat("pull mixed versions ", got, " and ", v));
  }
  bytes_pulled_ += num_parameters_ * static_cast<int64_t>(sizeof(float));
  return got;
}

}  // namespace ps::worker
