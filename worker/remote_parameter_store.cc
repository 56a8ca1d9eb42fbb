#include "worker/remote_parameter_store.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/f32_pieces.h"
#include "common/grpc_status.h"
#include "common/job_token.h"
#include "common/optimizer/optimizer.h"
#include "common/status_macros.h"
#include "proto/wire_format.h"

namespace ps::worker {
namespace {

// A gRPC call's deadline: gRPC enforces it in real time, so it is a
// wall-clock time whatever the store's clock (options.clock).
std::chrono::system_clock::time_point WallDeadlineAfter(absl::Duration d) {
  return absl::ToChronoTime(absl::Now() + d);
}

// The payload RegisterOnce puts on a refusal the server marked with
// proto::kRetryRegisterMetadataKey: this worker's id is live there.
constexpr char kLiveIdPayload[] = "ps.worker/live-id";

// How long ago `then_ns` was on `clock`; infinite for kNoReading.
constexpr int64_t kNoReading = std::numeric_limits<int64_t>::min();
absl::Duration Since(const Clock& clock, int64_t then_ns) {
  if (then_ns == kNoReading) return absl::InfiniteDuration();
  return absl::Nanoseconds(clock.NowNanos() - then_ns);
}

// The dtype a codec's chunks carry on the wire (pushes it encodes, pulls
// that ask for it and whose replies must carry it).
proto::DType WireDType(const WireCodec& codec) {
  return codec.dtype() == DType::kF16    ? proto::DTYPE_F16
         : codec.dtype() == DType::kBF16 ? proto::DTYPE_BF16
                                         : proto::DTYPE_F32;
}

}  // namespace

RemoteParameterStore::RemoteParameterStore(const RemoteStoreOptions& options)
    : options_(options), events_(options_.observer, options_.clock) {}

RemoteParameterStore::~RemoteParameterStore() {
  {
    absl::MutexLock lock(&heartbeats_mu_);
    stop_heartbeats_ = true;
  }
  if (heartbeats_.joinable()) heartbeats_.join();
}

void RemoteParameterStore::SendHeartbeats() {
  const Clock& clock = *options_.clock;
  int64_t last_log_ns = kNoReading;
  int64_t last_bound_log_ns = kNoReading;
  // Sleeps one interval on the clock (from the end of the previous
  // heartbeat); true once the destructor asks the thread to stop.
  auto stop_within_interval = [&] {
    absl::MutexLock lock(&heartbeats_mu_);
    return clock.AwaitWithDeadline(&heartbeats_mu_, absl::Condition(&stop_heartbeats_),
                                   clock.DeadlineAfter(options_.heartbeat_interval));
  };
  while (!stop_within_interval()) {
    proto::HeartbeatRequest request;
    grpc::ClientContext context;
    context.set_deadline(WallDeadlineAfter(options_.heartbeat_interval));
    if (!options_.job_token.empty()) {
      context.AddMetadata(kJobTokenMetadataKey, options_.job_token);
    }
    {
      absl::MutexLock lock(&session_mu_);
      request.set_rank(session_rank_);
      context.AddMetadata(proto::kSessionMetadataKey, session_);
    }
    if (options_.report) options_.report(&request);
    proto::HeartbeatReply reply;
    // A failure says nothing the training calls will not: the server is
    // away, restarting, or shutting down.
    if (!stub_->Heartbeat(&context, request, &reply).ok()) continue;
    if (consistency_.stale_pulls() && options_.log &&
        Since(clock, last_bound_log_ns) >= options_.stall_log_every) {
      // A pull still waiting for a version the server lacks: the step it is
      // for (version + S) is held back by the ranks that have not pushed
      // the iteration before that version.
      int64_t waits_for = -1;
      {
        absl::MutexLock lock(&staleness_mu_);
        if (!pulls_in_flight_.empty()) waits_for = pulls_in_flight_.rbegin()->first;
      }
      if (waits_for > reply.version()) {
        std::vector<std::string> ranks, steps;
        for (int r = 0; r < reply.rank_steps_size(); ++r) {
          if (r == request.rank() || reply.rank_steps(r) >= waits_for) continue;
          ranks.push_back(absl::StrCat(r));
          steps.push_back(absl::StrCat(reply.rank_steps(r)));
        }
        if (!ranks.empty()) {
          last_bound_log_ns = clock.NowNanos();
          options_.log(absl::StrCat("step ", waits_for + consistency_.staleness_bound(),
                                    " waits for ranks ", absl::StrJoin(ranks, ", "), " (at step",
                                    steps.size() > 1 ? "s " : " ", absl::StrJoin(steps, ", "),
                                    "; ", consistency_.Name(), ")"));
        }
      }
    }
    // Waiting for others: their ranks are missing, not only ours.
    bool others = false;
    for (int rank : reply.missing_ranks()) others |= rank != request.rank();
    if (!others || reply.stall_report().empty() || !options_.log) continue;
    if (Since(clock, last_log_ns) < options_.stall_log_every) continue;
    last_log_ns = clock.NowNanos();
    options_.log(absl::StrCat("rank ", request.rank(), " waits: ", reply.stall_report()));
  }
}

absl::StatusOr<std::unique_ptr<RemoteParameterStore>> RemoteParameterStore::Create(
    const RemoteStoreOptions& options) {
  if (options.server_address.empty()) return absl::InvalidArgumentError("no server address");
  if (options.clock == nullptr) return absl::InvalidArgumentError("no clock");
  if (options.connections < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("connections per direction must be >= 1, got ", options.connections));
  }
  if (options.steps_per_epoch < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("negative steps per epoch ", options.steps_per_epoch));
  }
  std::unique_ptr<RemoteParameterStore> store(new RemoteParameterStore(options));
  PS_ASSIGN_OR_RETURN(store->codec_, MakeWireCodec(options.compression));
  PS_ASSIGN_OR_RETURN(store->exact_, MakeWireCodec("none"));
  store->pull_codec_ = store->codec_->sparse() ? store->exact_.get() : store->codec_.get();
  if (store->options_.worker_id.empty()) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    store->options_.worker_id = absl::StrCat(host, "-", getpid());
  }
  if (store->options_.identity_proof.empty()) {
    PS_ASSIGN_OR_RETURN(store->options_.identity_proof, RandomHexToken(32));
  }
  // Pushes and pulls on TCP connections of their own: on one connection a
  // direction's HTTP/2 flow-control updates queue behind megabytes of the
  // other direction's data, which stalled pulls behind pushes (measured
  // behind a shaped 1 Gbit/s link: each pull of a 4 MiB message took 3x its
  // wire time while pushes ran). A local subchannel pool per channel keeps
  // gRPC from sharing one connection between them.
  PS_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                      MakeChannelCredentials(options.tls));
  auto own_connection = [&] {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    // A server that restarts is reconnected to within 2 s of coming back
    // (gRPC's default back-off grows to 2 minutes). Not the minimum
    // back-off: gRPC takes it as each connection attempt's timeout too, and
    // at 100 ms a TLS handshake on a busy machine never completed.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
    AddTlsChannelArgs(options.tls, &args);
    return grpc::CreateCustomChannel(options.server_address, credentials, args);
  };
  for (int c = 0; c < options.connections; ++c) {
    store->push_channels_.push_back(own_connection());
    store->pull_channels_.push_back(own_connection());
    store->push_stubs_.push_back(std::make_unique<grpc::GenericStub>(store->push_channels_.back()));
    store->pull_stubs_.push_back(std::make_unique<grpc::GenericStub>(store->pull_channels_.back()));
  }
  store->stub_ = proto::ParameterServer::NewStub(store->push_channels_[0]);
  return store;
}

// One StartMessages: its calls, the replies still outstanding (and the
// starting itself, so that replies completing while calls are still being
// issued cannot finish it early), and the slices of caller memory still lent
// to gRPC. `done` runs once every reply is in: the server has every byte,
// so gRPC reads none of the lent memory after that, though it may drop its
// references later (chttp2 keeps a written message's slices until its next
// write completes, which held each pull back by one push when pulls waited
// for it). After a failure `done` also waits for every loan, since a
// cancelled call may still be writing. The calls are destroyed before `done`
// runs (once it has, the caller may tear down the store and its channel);
// the batch itself, when the last loan is back.
class RemoteParameterStore::Batch {
 public:
  struct Call {
    grpc::ClientContext context;
    grpc::ByteBuffer request;
    grpc::ByteBuffer reply;
    int64_t start_ns = 0;
  };

  Batch(size_t calls, Done done) : calls_(calls), done_(std::move(done)) {
    for (auto& call : calls_) call = std::make_unique<Call>();
  }

  Call& call(size_t i) { return *calls_[i]; }

  // One more reply to wait for.
  void ExpectReply() {
    absl::MutexLock lock(&mu_);
    ++replies_;
  }

  void ReplyDone(const absl::Status& status) {
    Finished finished;
    {
      absl::MutexLock lock(&mu_);
      if (!status.ok() && first_error_.ok()) first_error_ = status;
      --replies_;
      finished = TakeFinishedLocked();
    }
    Finish(std::move(finished));
  }

  // A slice over caller bytes, counted until gRPC drops it.
  grpc::Slice Lend(const void* bytes, size_t size) {
    {
      absl::MutexLock lock(&mu_);
      ++loans_;
    }
    return proto::BorrowedSlice(bytes, size, &ReturnLoan, this);
  }

 private:
  // What is due once the lock is released.
  struct Finished {
    std::vector<std::unique_ptr<Call>> calls;  // to destroy
    Done done;                                 // to run, with result
    absl::Status result;
    bool last = false;  // nothing is left: delete the batch
  };

  static void ReturnLoan(void* arg) {
    auto* batch = static_cast<Batch*>(arg);
    Finished finished;
    {
      absl::MutexLock lock(&batch->mu_);
      --batch->loans_;
      finished = batch->TakeFinishedLocked();
    }
    batch->Finish(std::move(finished));
  }

  Finished TakeFinishedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Finished f;
    if (replies_ == 0) f.calls.swap(calls_);
    if (done_ && replies_ == 0 && (first_error_.ok() || loans_ == 0)) {
      f.done = std::move(done_);
      done_ = nullptr;
      f.result = first_error_;
    }
    f.last = replies_ == 0 && loans_ == 0;
    return f;
  }

  // Destroys the calls, deletes the batch if it was the last thing, then
  // runs `done`: in that order, see the class comment.
  void Finish(Finished f) {
    f.calls.clear();
    Done done = std::move(f.done);
    const absl::Status result = f.result;
    if (f.last) delete this;
    if (done) done(result);
  }

  std::vector<std::unique_ptr<Call>> calls_;  // emptied once every reply is in
  absl::Mutex mu_;
  int64_t replies_ ABSL_GUARDED_BY(mu_) = 1;  // the starting counts as one
  int64_t loans_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
  Done done_ ABSL_GUARDED_BY(mu_);
};

void RemoteParameterStore::StartMessages(
    const char* what, const char* method, EventKind kind, int64_t step, int first, int last,
    absl::Duration timeout,
    std::function<grpc::ByteBuffer(size_t, const Lend&)> fill,
    std::function<absl::Status(size_t, const grpc::ByteBuffer&)> check, Done done) {
  auto* batch = new Batch(static_cast<size_t>(last - first), std::move(done));
  // Shared by the calls' callbacks, which may outlive this frame.
  auto shared_check =
      std::make_shared<std::function<absl::Status(size_t, const grpc::ByteBuffer&)>>(
          std::move(check));
  const Lend lend = [batch](const void* bytes, size_t size) { return batch->Lend(bytes, size); };
  for (int m = first; m < last; ++m) {
    Batch::Call& call = batch->call(static_cast<size_t>(m - first));
    batch->ExpectReply();
    call.context.set_deadline(WallDeadlineAfter(timeout));
    AddCredentials(&call.context);
    call.request = fill(static_cast<size_t>(m), lend);
    call.start_ns = events_.Start();
    // Message m always takes the same connection of its direction.
    const auto& stubs = kind == EventKind::kPullMessage ? pull_stubs_ : push_stubs_;
    grpc::GenericStub& stub = *stubs[m % stubs.size()];
    stub.UnaryCall(
        &call.context, method, grpc::StubOptions(), &call.request, &call.reply,
        [this, batch, &call, m, what, kind, step, shared_check](grpc::Status status) {
          const Message& message = messages_[m];
          events_.ReportSince(kind, RpcLane(m), step, key_names_[message.front().key],
                              message_elements_[m] * static_cast<int64_t>(sizeof(float)),
                              call.start_ns);
          absl::Status s = FromGrpcStatus(
              status, absl::StrCat(what, " of key ", message.front().key, " chunk ",
                                   message.front().index, " (and the rest of its message) at ",
                                   options_.server_address));
          if (s.ok() && *shared_check) s = (*shared_check)(static_cast<size_t>(m), call.reply);
          // Our references to the lent slices go; gRPC drops its own once it
          // has written the bytes, which the reply implies, or cancelled.
          call.request.Clear();
          call.reply.Clear();
          batch->ReplyDone(s);
        });
  }
  batch->ReplyDone(absl::OkStatus());  // every call is issued
}

template <typename Header>
void RemoteParameterStore::SendFrames(
    const char* what, const char* method, int64_t step, int first, int last,
    absl::Span<const float> flat, const WireCodec& codec, std::function<void(Header*)> header,
    std::function<absl::Status(size_t, const grpc::ByteBuffer&)> check, Done done) {
  const bool encode = codec.dtype() != DType::kF32 || codec.sparse();
  const bool feedback = codec.sparse();
  // Pushes of dense F32 through shared memory: the frame carries headers.
  char* const shared = use_segment_ && !encode && absl::string_view(method) == proto::kPushMethod
                           ? segment_->data()
                           : nullptr;
  const proto::DType dtype = WireDType(codec);
  StartMessages(
      what, method, EventKind::kPushMessage, step, first, last, options_.rpc_timeout,
      [this, flat, &codec, encode, feedback, dtype, shared, header = std::move(header)](
          size_t m, const Lend& lend) {
        Header h;
        header(&h);
        std::vector<grpc::Slice> data;
        data.reserve(messages_[m].size());
        for (const Chunk& chunk : messages_[m]) {
          proto::TensorChunk* t = h.add_chunks();
          t->set_key(chunk.key);
          t->set_chunk(chunk.index);
          t->set_dtype(dtype);
          if (codec.sparse()) t->set_encoding(proto::ENCODING_TOPK);
          const int64_t bytes = codec.EncodedBytes(chunk.length);
          t->set_data_bytes(bytes);
          if (shared != nullptr) {
            const int64_t at = chunk.offset * static_cast<int64_t>(sizeof(float));
            std::memcpy(shared + at, flat.data() + chunk.offset, static_cast<size_t>(bytes));
            t->set_in_shared_memory(true);
            t->set_shm_offset(at);
          } else if (encode) {
            // Encoded at the chunk's own place in the scratch buffer.
            char* at = push_scratch_.data() + chunk.scratch_offset;
            codec.Encode(flat.subspan(chunk.offset, chunk.length),
                         feedback ? absl::MakeSpan(residual_).subspan(chunk.offset, chunk.length)
                                  : absl::Span<float>(),
                         at);
            data.push_back(lend(at, static_cast<size_t>(bytes)));
          } else {
            data.push_back(lend(flat.data() + chunk.offset, static_cast<size_t>(bytes)));
          }
        }
        return proto::MakeFrame(h, data);
      },
      std::move(check), std::move(done));
}

void RemoteParameterStore::AddCredentials(grpc::ClientContext* context) const {
  if (!options_.job_token.empty()) context->AddMetadata(kJobTokenMetadataKey, options_.job_token);
  if (!session_.empty()) context->AddMetadata(proto::kSessionMetadataKey, session_);
}

absl::StatusOr<ParameterStore::Registration> RemoteParameterStore::Register(
    const std::vector<ParamSpec>& signature, absl::Span<const float> proposed) {
  return RegisterRetrying(signature, proposed, options_.connect_timeout, /*reconnecting=*/false);
}

absl::StatusOr<ParameterStore::Registration> RemoteParameterStore::Reconnect(
    const std::vector<ParamSpec>& signature, absl::Span<const float> proposed) {
  {
    absl::MutexLock lock(&session_mu_);
    session_.clear();  // the lost server's, if it restarted
  }
  {
    absl::MutexLock lock(&members_mu_);
    members_.clear();  // announced by the lost server
  }
  return RegisterRetrying(signature, proposed, options_.reconnect_timeout, /*reconnecting=*/true);
}

absl::StatusOr<ParameterStore::Registration> RemoteParameterStore::RegisterRetrying(
    const std::vector<ParamSpec>& signature, absl::Span<const float> proposed,
    absl::Duration timeout, bool reconnecting) {
  const Clock& clock = *options_.clock;
  const int64_t start_ns = clock.NowNanos();
  const int64_t give_up_ns = clock.DeadlineAfter(timeout);
  absl::Duration backoff = absl::Milliseconds(100);
  std::optional<absl::Status> live_refusal;  // the last "id is live" refusal
  auto elapsed = [&] {
    return absl::FormatDuration(absl::Trunc(Since(clock, start_ns), absl::Milliseconds(100)));
  };
  auto asked_to_stop = [&] { return reconnecting && options_.should_stop && options_.should_stop(); };
  auto stopped = [&] {
    return absl::CancelledError(absl::StrCat("asked to stop while waiting for the parameter server at ",
                                             options_.server_address, " to come back (",
                                             elapsed(), ")"));
  };
  for (int attempt = 1;; ++attempt) {
    if (asked_to_stop()) return stopped();
    // Not waiting for the channel: a refused connection or a failed TLS
    // handshake comes back at once as UNAVAILABLE naming it, which the
    // log line below shows (waiting for the channel would say only
    // "Deadline Exceeded" at the end).
    // The attempt's gRPC deadline: what is left on the clock, at most 10 s,
    // from the wall clock's now.
    const absl::Duration left =
        absl::Nanoseconds(give_up_ns) - absl::Nanoseconds(clock.NowNanos());
    absl::StatusOr<Registration> registration =
        RegisterOnce(signature, proposed, absl::Now() + std::min(left, absl::Seconds(10)));
    // The server refused this worker's id as live (its previous process,
    // or another with the same --worker_id): that ends once the server
    // declares the holder lost.
    const bool live_id =
        !registration.ok() && registration.status().GetPayload(kLiveIdPayload).has_value();
    if (live_id) live_refusal = registration.status();
    const bool retry = !registration.ok() &&
                       (IsServerLost(registration.status()) || live_id ||
                        registration.status().code() == absl::StatusCode::kDeadlineExceeded);
    if (!retry) {
      if (registration.ok() && options_.log && (reconnecting || attempt > 1)) {
        options_.log(absl::StrCat(reconnecting ? "reconnected to" : "registered with",
                                  " the parameter server at ", options_.server_address, " after ",
                                  elapsed(), " (attempt ", attempt, "): ",
                                  reconnecting ? "resuming at" : "starting at", " version ",
                                  registration->version));
      }
      return registration;
    }
    // (The last attempt, given what little time was left, may have ended
    // in its deadline instead.)
    if (clock.NowNanos() >= give_up_ns && live_refusal.has_value()) {
      return absl::AlreadyExistsError(absl::StrCat(
          "worker id '", options_.worker_id, "' stayed live on the parameter server at ",
          options_.server_address, " for ", absl::FormatDuration(timeout), " (", attempt,
          " attempts): another process runs with this --worker_id, or this one lacks the "
          "--identity_file of the worker it replaces; the server said: ",
          live_refusal->message()));
    }
    if (clock.NowNanos() >= give_up_ns) {
      // A TLS handshake the server refuses (a plaintext client, a missing
      // or foreign client certificate) reaches no handler: gRPC says no
      // more than for a server that is down, so the message says both.
      const bool refused =
          absl::StrContains(registration.status().message(), "Connection refused");
      return absl::UnavailableError(absl::StrCat(
          "the parameter server at ", options_.server_address, " did not answer within ",
          absl::FormatDuration(timeout), " (", attempt, " attempts; ",
          refused ? "nothing listens there: is the server running, on this address? In a "
                    "container it must bind 0.0.0.0 (--bind_address) and workers dial its "
                    "service name"
                  : "if it is up, its TLS settings refuse this worker's: compare --tls_ca, "
                    "--tls_cert and --tls_key with its --tls_cert and --tls_client_ca",
          "; `worker --check` diagnoses it); last error: ", registration.status().message()));
    }
    if (options_.log && live_id) {
      options_.log(absl::StrCat("waiting for the parameter server at ", options_.server_address,
                                " to declare worker id '", options_.worker_id,
                                "''s holder lost (", elapsed(), ", attempt ", attempt,
                                "): ", registration.status().message()));
    } else if (options_.log) {
      options_.log(absl::StrCat("waiting for the parameter server at ", options_.server_address,
                                " (", elapsed(), ", attempt ", attempt,
                                "): ", registration.status().message()));
    }
    const int64_t wake_ns = std::min(clock.DeadlineAfter(backoff), give_up_ns);
    while (clock.NowNanos() < wake_ns) {
      if (asked_to_stop()) return stopped();
      clock.SleepUntil(std::min(wake_ns, clock.DeadlineAfter(absl::Milliseconds(50))));
    }
    backoff = std::min(backoff * 2, absl::Seconds(2));
  }
}

absl::StatusOr<ParameterStore::Registration> RemoteParameterStore::RegisterOnce(
    const std::vector<ParamSpec>& signature, absl::Span<const float> proposed,
    absl::Time deadline) {
  // 1. The request: this worker, its model, and shared memory if offered.
  proto::RegisterRequest request = MakeRegisterRequest(signature);
  // No shared memory until the server attaches the new segment: the offer
  // drops the old one, and may fail after that.
  use_segment_ = false;
  PS_ASSIGN_OR_RETURN(const bool offer, OfferSharedMemory(signature, &request));
  // 2. The call.
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  AddCredentials(&context);  // the token; no session yet (Reconnect cleared it)
  proto::RegisterReply reply;
  absl::Status registered = FromGrpcStatus(stub_->Register(&context, request, &reply),
                                           absl::StrCat("Register with ", options_.server_address));
  if (!registered.ok() &&
      context.GetServerTrailingMetadata().count(proto::kRetryRegisterMetadataKey) > 0) {
    registered.SetPayload(kLiveIdPayload, absl::Cord());
  }
  PS_RETURN_IF_ERROR(registered);
  // 3. The reply vetted before any of it is kept.
  PS_ASSIGN_OR_RETURN(const WorkerConsistency consistency, CheckRegisterReply(reply));
  // 4. The session: rank, shared memory, credential, heartbeats.
  AdoptSession(reply, offer);
  // 5. The model cut into the server's chunks, and those into messages.
  LayOutMessages(signature, reply.chunk_elements());
  // 6. The initial parameters, when the server asks this worker for them.
  if (reply.send_initial_parameters()) {
    PS_RETURN_IF_ERROR(SendInitialParameters(proposed));
    sent_initial_parameters_ = true;
  }
  // 7. What the caller learns, and the state pulls and pushes start from.
  return AdoptRegistration(reply, consistency);
}

proto::RegisterRequest RemoteParameterStore::MakeRegisterRequest(
    const std::vector<ParamSpec>& signature) const {
  proto::RegisterRequest request;
  request.set_worker_id(options_.worker_id);
  // The rank asked for, else the one held before (a reconnect): a restarted
  // server hands out ranks in arrival order, and a worker coming back as
  // another rank would change the rank order of every sum, or, as rank 0,
  // be asked for the initial parameters it does not keep.
  const int requested_rank = options_.rank >= 0 ? options_.rank : rank_;
  if (requested_rank >= 0) request.set_requested_rank(requested_rank);
  request.set_steps_per_epoch(options_.steps_per_epoch);
  request.set_identity_proof(options_.identity_proof);
  request.set_job_run(job_run_);
  for (const ParamSpec& spec : signature) {
    proto::TensorSpec* t = request.add_signature();
    t->set_name(spec.name);
    t->set_dtype(proto::DTYPE_F32);
    for (int64_t d : spec.shape) t->add_shape(d);
  }
  return request;
}

absl::StatusOr<bool> RemoteParameterStore::OfferSharedMemory(
    const std::vector<ParamSpec>& signature, proto::RegisterRequest* request) {
  // Shared memory: a push area and a pull area of every parameter.
  const bool offer = options_.shared_memory && codec_->dtype() == DType::kF32 && !codec_->sparse();
  if (!offer) return false;
  int64_t elements = 0;
  for (const ParamSpec& spec : signature) elements += NumElements(spec.shape);
  // A fresh segment per registration: a pull of an earlier session that
  // the server answers late writes into memory nobody reads any more.
  segment_.reset();
  PS_ASSIGN_OR_RETURN(segment_, SharedMemorySegment::Create(static_cast<size_t>(
                                    8 * std::max<int64_t>(elements, 1))));
  proto::SharedMemory* shm = request->mutable_shared_memory();
  shm->set_pid(segment_->pid());
  shm->set_fd(segment_->fd());
  shm->set_data_bytes(segment_->data_bytes());
  shm->set_nonce(segment_->nonce());
  return true;
}

absl::StatusOr<WorkerConsistency> RemoteParameterStore::CheckRegisterReply(
    const proto::RegisterReply& reply) const {
  absl::StatusOr<WorkerConsistency> consistency =
      WorkerConsistency::FromName(reply.consistency());
  if (!consistency.ok()) {
    return absl::Status(consistency.status().code(),
                        absl::StrCat("the server at ", options_.server_address, " runs with ",
                                     consistency.status().message()));
  }
  if (!reply.optimizer().empty() && reply.optimizer() != kSgdOptimizer &&
      reply.optimizer() != kMeanGradientOptimizer) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the server at ", options_.server_address, " runs optimizer '", reply.optimizer(),
        "', which this worker does not know (", kSgdOptimizer, ", ", kMeanGradientOptimizer,
        ")"));
  }
  if (reply.chunk_elements() < 1 || reply.num_workers() < 1 || reply.rank() < 0 ||
      reply.rank() >= reply.num_workers()) {
    return absl::InternalError(absl::StrCat("server ", options_.server_address,
                                            " sent a malformed registration reply"));
  }
  if (codec_->sparse() && reply.loss_scale() > 0) {
    // An overflowing step poisons its push with NaN so that every chunk
    // skips the update; top-k pairs carry finite values only (the server
    // refuses others), and the NaN would stay in the residual for good.
    return absl::InvalidArgumentError(absl::StrCat(
        "--compression=", codec_->name(), " cannot run with the dynamic loss scaling of ",
        options_.server_address, " (--loss_scale=dynamic): an overflow's NaN cannot travel as "
        "top-k pairs; use --compression=none, fp16 or bf16, or no loss scaling"));
  }
  return consistency;
}

void RemoteParameterStore::AdoptSession(const proto::RegisterReply& reply, bool offered) {
  rank_ = reply.rank();
  use_segment_ = offered && reply.shared_memory_attached();
  if (offered && options_.log) {
    options_.log(use_segment_ ? absl::StrCat("tensor bytes to and from ", options_.server_address,
                                             " go through shared memory")
                              : absl::StrCat("the server at ", options_.server_address,
                                             " did not map this worker's shared memory (",
                                             reply.shared_memory_error(),
                                             "); tensor bytes go by TCP"));
  }
  {
    absl::MutexLock lock(&session_mu_);
    session_ = reply.session();
    session_rank_ = reply.rank();
  }
  if (!heartbeats_.joinable() && options_.heartbeat_interval > absl::ZeroDuration()) {
    heartbeats_ = std::thread([this] { SendHeartbeats(); });
  }
}

void RemoteParameterStore::LayOutMessages(const std::vector<ParamSpec>& signature,
                                          int64_t chunk_elements) {
  messages_.clear();
  message_elements_.clear();
  key_names_.clear();
  int64_t offset = 0;
  int64_t scratch = 0;
  for (int key = 0; key < static_cast<int>(signature.size()); ++key) {
    key_names_.push_back(signature[key].name);
    const int64_t n = NumElements(signature[key].shape);
    const int64_t count = ChunkCount(n, chunk_elements);
    for (int64_t c = 0; c < count; ++c) {
      const int64_t begin = c * chunk_elements;
      Chunk chunk{key, c, offset + begin, std::min(chunk_elements, n - begin)};
      chunk.scratch_offset = scratch;
      scratch += codec_->EncodedBytes(chunk.length);
      if (messages_.empty() || message_elements_.back() + chunk.length > chunk_elements) {
        messages_.emplace_back();
        message_elements_.push_back(0);
      }
      messages_.back().push_back(chunk);
      message_elements_.back() += chunk.length;
    }
    offset += n;
  }
  num_parameters_ = offset;
  if (codec_->dtype() != DType::kF32 || codec_->sparse()) push_scratch_.resize(scratch);
  // A new registration (a reconnect rolls back to the server's version):
  // what earlier pushes left unsent belongs to steps that are gone.
  if (codec_->sparse()) residual_.assign(offset, 0.f);
}

ParameterStore::Registration RemoteParameterStore::AdoptRegistration(
    const proto::RegisterReply& reply, const WorkerConsistency& consistency) {
  Registration out;
  out.rank = reply.rank();
  out.num_workers = reply.num_workers();
  out.version = reply.version();
  out.members.assign(reply.members().begin(), reply.members().end());
  out.dynamic_members = reply.shrinks();
  out.consistency = consistency;
  out.loss_scale = reply.loss_scale();
  // A server from before the field runs SGD.
  out.optimizer = reply.optimizer().empty() ? kSgdOptimizer : reply.optimizer();
  out.job_run = reply.job_run();
  {
    absl::MutexLock lock(&loss_scale_mu_);
    loss_scale_ = reply.loss_scale();
    loss_scale_version_ = reply.version();
  }
  consistency_ = consistency;
  {
    absl::MutexLock lock(&staleness_mu_);
    pulled_version_.assign(messages_.size(), reply.version());
  }
  delta_pulls_ = codec_->sparse() && consistency_.allows_delta_pulls();
  {
    absl::MutexLock lock(&held_mu_);
    held_version_.assign(messages_.size(), -1);
    held_buffer_ = nullptr;
  }
  if (!out.members.empty()) {
    absl::MutexLock lock(&members_mu_);
    members_[out.version] = out.members;
  }
  return out;
}

absl::Status RemoteParameterStore::SendInitialParameters(absl::Span<const float> proposed) {
  if (static_cast<int64_t>(proposed.size()) != num_parameters_) {
    return absl::InvalidArgumentError(
        absl::StrCat("the server asks for this worker's initial parameters, but it proposed ",
                     proposed.size(), " elements for a model of ", num_parameters_));
  }
  const int rank = rank_;
  return AwaitDone([&](Done done) {
    SendFrames<proto::InitializeRequest>(
        "Initialize", proto::kInitializeMethod, /*step=*/-1, 0,
        static_cast<int>(messages_.size()), proposed, *exact_,
        [rank](proto::InitializeRequest* header) { header->set_rank(rank); }, {},
        std::move(done));
  });
}

absl::Status RemoteParameterStore::CheckSegments(const char* what, int first, int last,
                                                 size_t size) const {
  if (rank_ < 0) return absl::FailedPreconditionError(absl::StrCat(what, " before Register"));
  if (first < 0 || last < first || last > static_cast<int>(messages_.size())) {
    return absl::InvalidArgumentError(absl::StrCat(what, " of segments [", first, ", ", last,
                                                   "): the model has ", messages_.size()));
  }
  if (static_cast<int64_t>(size) != num_parameters_) {
    return absl::InvalidArgumentError(absl::StrCat(what, " with a buffer of ", size,
                                                   " elements; the model has ",
                                                   num_parameters_));
  }
  return absl::OkStatus();
}

std::vector<int64_t> RemoteParameterStore::SegmentEnds() const {
  std::vector<int64_t> ends;
  ends.reserve(messages_.size());
  for (const Message& message : messages_) {
    ends.push_back(message.back().offset + message.back().length);
  }
  return ends;
}

void RemoteParameterStore::PushSegments(int64_t iteration, int64_t num_samples, int first,
                                        int last, absl::Span<const float> gradient, Done done) {
  if (absl::Status s = CheckSegments("Push", first, last, gradient.size()); !s.ok()) {
    return done(s);
  }
  // Bytes on the wire: each chunk as the codec encodes it (top-k counts
  // per chunk).
  int64_t wire_bytes = 0;
  for (int m = first; m < last; ++m) {
    for (const Chunk& chunk : messages_[m]) wire_bytes += codec_->EncodedBytes(chunk.length);
  }
  const int rank = rank_;
  int64_t based_on = 0;
  if (consistency_.reports_staleness()) {
    // The least version the pushed messages' parameters came from.
    absl::MutexLock lock(&staleness_mu_);
    based_on = *std::min_element(pulled_version_.begin() + first, pulled_version_.begin() + last);
  }
  SendFrames<proto::PushRequest>(
      "Push", proto::kPushMethod, iteration, first, last, gradient, *codec_,
      [rank, iteration, num_samples, based_on](proto::PushRequest* header) {
        header->set_rank(rank);
        header->set_iteration(iteration);
        header->set_num_samples(num_samples);
        header->set_based_on_version(based_on);
      },
      [this](size_t, const grpc::ByteBuffer& reply) { return ReadPushReply(reply); },
      [this, wire_bytes, done = std::move(done)](absl::Status status) {
        if (status.ok()) bytes_pushed_ += wire_bytes;
        done(status);
      });
}

absl::Status RemoteParameterStore::ReadPushReply(const grpc::ByteBuffer& reply) {
  proto::PushReply message;
  if (absl::Status s = proto::ParseMessage(reply, "push reply", &message); !s.ok()) {
    return absl::InternalError(absl::StrCat("server sent a malformed ", s.message()));
  }
  if (consistency_.reports_staleness()) {
    absl::MutexLock lock(&staleness_mu_);
    ++staleness_[message.staleness()];
  }
  if (message.members_size() == 0) return absl::OkStatus();
  absl::MutexLock lock(&members_mu_);
  auto [it, added] = members_.try_emplace(message.members_iteration());
  if (added) {
    it->second.assign(message.members().begin(), message.members().end());
    // A few iterations back are enough: a step asks for its own.
    while (members_.size() > 8) members_.erase(members_.begin());
  }
  return absl::OkStatus();
}

std::map<int64_t, int64_t> RemoteParameterStore::staleness_histogram() const {
  absl::MutexLock lock(&staleness_mu_);
  return staleness_;
}

absl::StatusOr<std::vector<int>> RemoteParameterStore::Members(int64_t iteration,
                                                               int num_workers) {
  absl::MutexLock lock(&members_mu_);
  auto known = [this, iteration]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(members_mu_) {
    return members_.count(iteration) > 0;
  };
  if (!options_.clock->AwaitWithDeadline(&members_mu_, absl::Condition(&known),
                                         options_.clock->DeadlineAfter(options_.rpc_timeout))) {
    return absl::DeadlineExceededError(absl::StrCat(
        "no push reply from ", options_.server_address, " announced the members of iteration ",
        iteration, " within ", absl::FormatDuration(options_.rpc_timeout)));
  }
  return members_.at(iteration);
}

absl::Status RemoteParameterStore::Push(int64_t iteration, int64_t num_samples,
                                        absl::Span<const float> gradient) {
  if (rank_ < 0) return absl::FailedPreconditionError("Push before Register");
  if (static_cast<int64_t>(gradient.size()) != num_parameters_) {
    return absl::InvalidArgumentError(absl::StrCat("gradient has ", gradient.size(),
                                                   " elements, the model ", num_parameters_));
  }
  return AwaitDone([&](Done done) {
    PushSegments(iteration, num_samples, 0, static_cast<int>(messages_.size()), gradient,
                 std::move(done));
  });
}

absl::Status RemoteParameterStore::Restore(int64_t version) {
  if (rank_ < 0) return absl::FailedPreconditionError("Restore before Register");
  grpc::ClientContext context;
  context.set_deadline(WallDeadlineAfter(options_.rpc_timeout));
  AddCredentials(&context);
  proto::RestoreRequest request;
  request.set_rank(rank_);
  request.set_version(version);
  proto::RestoreReply reply;
  return FromGrpcStatus(stub_->Restore(&context, request, &reply),
                        absl::StrCat("Restore version ", version, " at ",
                                     options_.server_address));
}

absl::Status RemoteParameterStore::WaitForVersion(int64_t version) {
  grpc::ClientContext context;
  context.set_deadline(WallDeadlineAfter(options_.wait_timeout + absl::Seconds(5)));
  AddCredentials(&context);
  proto::WaitRequest request;
  request.set_version(version);
  request.set_timeout_ms(absl::ToInt64Milliseconds(options_.wait_timeout));
  proto::WaitReply reply;
  return FromGrpcStatus(stub_->Wait(&context, request, &reply),
                        absl::StrCat("Wait for version ", version, " at ",
                                     options_.server_address));
}

void RemoteParameterStore::StartPull(int64_t version, int first, int last,
                                     absl::Span<float> params, bool exact,
                                     std::function<void(absl::StatusOr<int64_t>)> done) {
  // The version each message's reply carried, read when the batch is done.
  auto versions = std::make_shared<std::vector<int64_t>>(last - first, version);
  // A segment's pull is held for the other workers' pushes: it may wait as
  // long as WaitForVersion would.
  const absl::Duration timeout = exact ? options_.wait_timeout : options_.rpc_timeout;
  const int64_t timeout_ms = absl::ToInt64Milliseconds(timeout);
  // Asynchronous: whatever is newest, at once. ssp:S: the newest of version
  // - S or later, once that exists (the staleness bound).
  const bool stale = consistency_.stale_pulls();
  const int64_t asked = consistency_.OldestPullable(version);
  // 1. Note the pull: the version it asks for (the heartbeat thread names
  //    whom it waits for), and the buffer its deltas apply to.
  if (stale) {
    absl::MutexLock lock(&staleness_mu_);
    ++pulls_in_flight_[asked];
  }
  if (delta_pulls_) {
    absl::MutexLock lock(&held_mu_);
    if (held_buffer_ != params.data()) {
      // Another buffer holds nothing this store knows of.
      std::fill(held_version_.begin(), held_version_.end(), -1);
      held_buffer_ = params.data();
    }
  }
  // Bytes the replies carried (dense, or deltas).
  auto received = std::make_shared<std::atomic<int64_t>>(0);
  StartMessages(
      "Pull", proto::kPullMethod, EventKind::kPullMessage, version - 1, first, last,
      timeout + absl::Seconds(5),
      // 2. Ask for every message at once.
      [this, asked, timeout_ms, exact](size_t m, const Lend&) {
        return PullRequestFor(m, asked, timeout_ms, exact);
      },
      // 3. Each reply is checked and copied out of gRPC's receive buffers
      //    straight into `params` on its completion thread, while the other
      //    messages are still in flight.
      [this, params, versions, first, received, version, exact](
          size_t m, const grpc::ByteBuffer& frame) -> absl::Status {
        return ReadPullReply(m, frame, version, exact, params, &(*versions)[m - first],
                             received.get());
      },
      // 4. Once every reply is in: the version they make together.
      [this, version, asked, exact, stale, versions, received,
       done = std::move(done)](absl::Status status) {
        if (stale) {
          absl::MutexLock lock(&staleness_mu_);
          if (--pulls_in_flight_[asked] == 0) pulls_in_flight_.erase(asked);
        }
        if (!status.ok()) return done(status);
        absl::StatusOr<int64_t> got = PulledVersion(*versions, version, exact);
        if (got.ok()) bytes_pulled_ += received->load();
        done(std::move(got));
      });
}

grpc::ByteBuffer RemoteParameterStore::PullRequestFor(size_t m, int64_t asked,
                                                      int64_t timeout_ms, bool exact) {
  proto::PullRequest request;
  request.set_version(asked);
  request.set_timeout_ms(timeout_ms);
  request.set_exact(exact && consistency_.exact_pulls());
  if (delta_pulls_) {
    absl::MutexLock lock(&held_mu_);
    request.set_delta(held_version_[m] == asked - 1);
  }
  request.set_dtype(WireDType(*pull_codec_));
  const bool shared = PullsIntoSharedMemory();
  request.set_shared_memory(shared);
  for (const Chunk& chunk : messages_[m]) {
    proto::ChunkId* id = request.add_chunks();
    id->set_key(chunk.key);
    id->set_chunk(chunk.index);
    if (shared) request.add_shm_offsets(PullOffset(chunk));
  }
  return proto::SerializeMessage(request);
}

absl::Status RemoteParameterStore::ReadPullReply(size_t m, const grpc::ByteBuffer& frame,
                                                 int64_t version, bool exact,
                                                 absl::Span<float> params,
                                                 int64_t* reply_version,
                                                 std::atomic<int64_t>* received) {
  const Message& wanted = messages_[m];
  if (delta_pulls_) {
    // Until this reply is wholly applied the buffer holds no version.
    absl::MutexLock lock(&held_mu_);
    held_version_[m] = -1;
  }
  proto::PullReply reply;
  auto reader = proto::FrameReader::Open(frame, "pull reply", &reply);
  absl::Status s = reader.ok() ? reader->Split(reply.chunks()) : reader.status();
  if (!s.ok()) return absl::InternalError(absl::StrCat("server sent a ", s.message()));
  if (reply.chunks_size() != static_cast<int>(wanted.size())) {
    return absl::InternalError(absl::StrCat("server sent ", reply.chunks_size(),
                                            " chunks, expected ", wanted.size()));
  }
  // Checked before any byte lands in `params` (the batch's end checks
  // that the messages agree with one another).
  if (exact && consistency_.exact_pulls() && reply.version() != version) {
    return absl::InternalError(absl::StrCat("server ", options_.server_address,
                                            " answered a pull of version ", version,
                                            " with version ", reply.version()));
  }
  for (size_t c = 0; c < wanted.size(); ++c) {
    const proto::TensorChunk& got = reply.chunks(static_cast<int>(c));
    *received += got.data_bytes();
    PS_RETURN_IF_ERROR(ReadPulledChunk(got, wanted[c], reader->pieces(c), params));
  }
  *reply_version = reply.version();
  NotePulledReply(m, reply, params.data());
  return absl::OkStatus();
}

absl::Status RemoteParameterStore::ReadPulledChunk(const proto::TensorChunk& got,
                                                   const Chunk& chunk,
                                                   absl::Span<const absl::string_view> pieces,
                                                   absl::Span<float> params) {
  if (got.encoding() == proto::ENCODING_DELTA) {
    // Only what changed since the version this buffer holds.
    if (!delta_pulls_ || got.key() != chunk.key || got.chunk() != chunk.index ||
        got.dtype() != proto::DTYPE_F32 || got.in_shared_memory()) {
      return absl::InternalError(absl::StrCat("server sent an unasked delta for key ", got.key(),
                                              " chunk ", got.chunk()));
    }
    absl::Status applied = ApplyDelta(pieces, params.subspan(chunk.offset, chunk.length));
    if (!applied.ok()) return absl::InternalError(absl::StrCat("server sent ", applied.message()));
    return absl::OkStatus();
  }
  const int64_t bytes = pull_codec_->EncodedBytes(chunk.length);
  if (got.key() != chunk.key || got.chunk() != chunk.index || got.data_bytes() != bytes ||
      got.dtype() != WireDType(*pull_codec_) || got.encoding() != proto::ENCODING_DENSE) {
    return absl::InternalError(absl::StrCat(
        "server sent key ", got.key(), " chunk ", got.chunk(), " with ", got.data_bytes(),
        " bytes of dtype ", got.dtype(), ", encoding ", got.encoding(), " where key ", chunk.key,
        " chunk ", chunk.index, " with ", bytes, " dense bytes of dtype ",
        WireDType(*pull_codec_), " was expected"));
  }
  if (got.in_shared_memory()) {
    // Written where this pull asked, before the reply was sent.
    if (!PullsIntoSharedMemory() || got.shm_offset() != PullOffset(chunk)) {
      return absl::InternalError(absl::StrCat("server put key ", got.key(), " chunk ",
                                              got.chunk(), " in shared memory at byte ",
                                              got.shm_offset(), ", not where it was asked"));
    }
    std::memcpy(params.data() + chunk.offset, segment_->data() + got.shm_offset(),
                static_cast<size_t>(bytes));
    return absl::OkStatus();
  }
  if (pull_codec_->dtype() == DType::kF32) {
    CopyPiecesTo(pieces, params.data() + chunk.offset);
    return absl::OkStatus();
  }
  absl::Status decoded = pull_codec_->Decode(pieces, params.subspan(chunk.offset, chunk.length));
  if (!decoded.ok()) return absl::InternalError(absl::StrCat("server sent ", decoded.message()));
  return absl::OkStatus();
}

void RemoteParameterStore::NotePulledReply(size_t m, const proto::PullReply& reply,
                                           const float* buffer) {
  if (delta_pulls_) {
    absl::MutexLock lock(&held_mu_);
    if (held_buffer_ == buffer) held_version_[m] = reply.version();
  }
  if (reply.loss_scale() > 0) {
    absl::MutexLock lock(&loss_scale_mu_);
    if (reply.loss_scale_version() >= loss_scale_version_) {
      loss_scale_ = reply.loss_scale();
      loss_scale_version_ = reply.loss_scale_version();
    }
  }
  if (consistency_.reports_staleness()) {
    absl::MutexLock lock(&staleness_mu_);
    if (m < pulled_version_.size()) pulled_version_[m] = reply.version();
  }
}

absl::StatusOr<int64_t> RemoteParameterStore::PulledVersion(const std::vector<int64_t>& versions,
                                                            int64_t version, bool exact) const {
  if (!consistency_.exact_pulls()) {
    // The newest of each message (asynchronous; or ssp:S, each at least
    // version - S): versions differ by design.
    return versions.empty() ? version : *std::min_element(versions.begin(), versions.end());
  }
  // Every message must come from one version, or the parameters would mix
  // two.
  const int64_t got = versions.empty() ? version : versions.front();
  for (int64_t v : versions) {
    if (v != got) {
      return absl::InternalError(absl::StrCat("pull mixed versions ", got, " and ", v));
    }
  }
  if (exact && got != version) {
    return absl::InternalError(absl::StrCat("server ", options_.server_address,
                                            " answered a pull of version ", version,
                                            " with version ", got));
  }
  return got;
}

void RemoteParameterStore::PullSegments(int64_t version, int first, int last,
                                        absl::Span<float> params, Done done) {
  if (absl::Status s = CheckSegments("Pull", first, last, params.size()); !s.ok()) {
    return done(s);
  }
  StartPull(version, first, last, params, /*exact=*/true,
            [done = std::move(done)](absl::StatusOr<int64_t> got) { done(got.status()); });
}

absl::StatusOr<int64_t> RemoteParameterStore::Pull(int64_t version, absl::Span<float> params) {
  if (rank_ < 0) return absl::FailedPreconditionError("Pull before Register");
  if (static_cast<int64_t>(params.size()) != num_parameters_) {
    return absl::InvalidArgumentError(absl::StrCat("parameter buffer has ", params.size(),
                                                   " elements, the model ", num_parameters_));
  }
  absl::StatusOr<int64_t> result;
  absl::Notification finished;
  StartPull(version, 0, static_cast<int>(messages_.size()), params, /*exact=*/false,
            [&](absl::StatusOr<int64_t> got) {
              result = std::move(got);
              finished.Notify();
            });
  finished.WaitForNotification();
  return result;
}

}  // namespace ps::worker
