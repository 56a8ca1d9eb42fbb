#ifndef PS_WORKER_REMOTE_PARAMETER_STORE_H_
#define PS_WORKER_REMOTE_PARAMETER_STORE_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/shared_memory.h"
#include "common/timed_event.h"
#include "common/tls_credentials.h"
#include "common/wire_codec.h"
#include "proto/parameter_server.grpc.pb.h"
#include "worker/parameter_store.h"

namespace ps::worker {

struct RemoteStoreOptions {
  std::string server_address = "127.0.0.1:50051";  // host:port
  std::string worker_id;  // stable per worker; default: hostname-pid
  int rank = -1;          // the rank to ask for; -1: any free one
  // Iterations in one epoch of this worker's data, stated at registration
  // (the server's epoch schedule needs it; all workers must agree). 0: none.
  int64_t steps_per_epoch = 0;
  // How long Register waits for the server to come up (retrying like
  // Reconnect, each wait logged with its reason: a refused connection, a
  // failed TLS handshake).
  absl::Duration connect_timeout = absl::Seconds(60);
  // TCP connections to the server for pushes, and as many again for pulls
  // (message m takes connection m % connections of its direction): one
  // stream may not fill a fast link (BytePS's finding; on loopback here one
  // push stream moved 2.8 GB/s, two 3.3), but more streams through one
  // shaped link lose more packets to its queue (two made MLP-20M steps 7 %
  // slower behind 1 Gbit/s), so one by default.
  int connections = 1;
  // Deadline of each Push and Initialize message, and of a blocking Pull's
  // (+ 5 s for the server to answer first: its own wait is this long).
  absl::Duration rpc_timeout = absl::Seconds(60);
  // How long WaitForVersion waits for the slowest worker, and a segment
  // pull (PullSegments: the server holds it until every worker's push of
  // those segments is in) likewise (+ 5 s).
  absl::Duration wait_timeout = absl::Seconds(600);
  // How long Reconnect keeps trying (bounded exponential back-off, 100 ms
  // doubling to 2 s between attempts) before it gives up.
  absl::Duration reconnect_timeout = absl::Seconds(300);
  // Reconnect gives up with kCancelled once this returns true (checked
  // before each attempt and every 50 ms of `clock` in its back-off): a
  // worker asked to stop does not wait for a lost server. May be empty.
  std::function<bool()> should_stop;
  // Called with a line saying what Reconnect waits for, at most once per
  // attempt (the worker prints it). May be empty.
  std::function<void(const std::string&)> log;
  // A heartbeat (with the session) this often once registered, so the
  // server knows this worker lives while it computes a long step; its
  // reply's stall report goes to `log`, at most once per
  // stall_log_every, while this worker waits for others. Under ssp:S a
  // step held back by the staleness bound is logged too, at most once per
  // stall_log_every, naming the slow ranks and their steps ("step 120
  // waits for ranks 1 (at step 117; ssp:2)"). Zero: none.
  absl::Duration heartbeat_interval = absl::Seconds(2);
  // What each heartbeat reports of this worker for the server's metrics
  // (steps and per-phase totals, filled into the request). May be empty.
  std::function<void(proto::HeartbeatRequest*)> report;
  absl::Duration stall_log_every = absl::Seconds(5);
  // The job token sent on every call (common/job_token.h); empty: none.
  std::string job_token;
  // This worker's identity secret (worker/identity_file.h), sent at every
  // registration: restarted, it takes back at once the rank its id holds.
  // Without it (and without a client certificate naming worker_id under
  // mutual TLS) a registration naming a live id is refused until the
  // server declares the holder lost; Register and Reconnect wait for that
  // within their timeouts, logging what they wait for. Empty: a random one
  // of this store's own, so that its reconnects to the same server process
  // are recognised at once (a restarted process is not).
  std::string identity_proof;
  // TLS or mutual TLS to the server (common/tls_credentials.h); default:
  // plaintext.
  ClientTlsOptions tls;
  // How gradients pushed and parameters pulled travel (common/wire_codec.h):
  // "none" (fp32), "fp16" or "bf16" (half the bytes each way; the server
  // keeps fp32), or "topk:F" (pushes only: the largest F of each chunk with
  // error feedback, the rest kept here for later steps; pulls in fp32).
  std::string compression = "none";
  // On the server's host: offer the server a shared memory segment at each
  // registration (common/shared_memory.h; 8 bytes per parameter of this
  // store, a push area and a pull area) and, when it maps it, move every
  // pushed and pulled byte through it (one memcpy each side) instead of
  // loopback TCP; gRPC carries only the headers. A server that cannot map
  // it (another host, PID namespace or user) says why, which goes to `log`,
  // and the bytes go by TCP as without. Dense F32 only: ignored with a
  // compression other than none.
  bool shared_memory = false;
  // Receives one kPushMessage / kPullMessage event per RPC, on RpcLane(m)
  // for message m (stable for the store's life), from gRPC's completion
  // threads. May be null. Both must outlive the store.
  EventObserver* observer = nullptr;
  // Times the events, and every wait of the store's own: Register's and
  // Reconnect's retries and back-off (connect_timeout, reconnect_timeout),
  // the heartbeat interval, stall_log_every, and how long Members waits
  // (rpc_timeout). The deadlines given to gRPC with each call (rpc_timeout,
  // wait_timeout, a heartbeat's, a Register attempt's) are wall-clock
  // times, which gRPC enforces in real time: the wall clock's now plus the
  // timeout (for a Register attempt, the time left on this clock, at most
  // 10 s). Never null.
  const Clock* clock = Clock::Real();
};

// The parameter store on the other side of a gRPC channel. Push, Pull and
// the initial parameters cut the flat buffer into the server's chunks, pack
// small chunks together into messages of at most one chunk's size, and send
// all messages concurrently (gRPC callback API), waiting for every reply;
// the first error is returned naming the message's first key and chunk.
// Every call carries the job token and, once registered, this worker's
// session credential (parameter_server.proto, "Credentials"); a server
// that restarted answers ABORTED, one that went away UNAVAILABLE, and
// Reconnect registers again.
// Register sends `proposed` only when the server asks for it (this worker
// has rank 0 and the server has no initial parameters of its own).
//
// No copies of tensor bytes but the one out of gRPC's receive buffers:
// Push and the initial parameters frame (proto/wire_format.h) slices that
// point straight into the caller's buffer, and Pull copies each reply's
// slices straight into `params`. So the buffer given to Push (or Register's
// `proposed`) is read by gRPC's threads while the call runs and must not
// change until it returns; it returns once every reply has arrived (the
// server has every byte, so gRPC reads no more of the buffer), and after a
// failure only once gRPC has dropped every slice into the buffer. The
// blocking calls are not thread-safe (one at a time); Push/PullSegments may
// be in flight together, started from any thread (parameter_store.h): they
// read only what registration fixed, and take locks for the rest.
class RemoteParameterStore final : public ParameterStore {
 public:
  static absl::StatusOr<std::unique_ptr<RemoteParameterStore>> Create(
      const RemoteStoreOptions& options);
  // Stops the heartbeats.
  ~RemoteParameterStore() override;

  absl::StatusOr<Registration> Register(const std::vector<ParamSpec>& signature,
                                        absl::Span<const float> proposed) override;
  absl::Status Push(int64_t iteration, int64_t num_samples,
                    absl::Span<const float> gradient) override;
  absl::Status WaitForVersion(int64_t version) override;
  absl::StatusOr<int64_t> Pull(int64_t version, absl::Span<float> params) override;
  float LossScale() const override {
    absl::MutexLock lock(&loss_scale_mu_);
    return loss_scale_;
  }
  absl::StatusOr<Registration> Reconnect(const std::vector<ParamSpec>& signature,
                                         absl::Span<const float> proposed) override;
  // Waits (up to rpc_timeout) for a push reply announcing them.
  absl::StatusOr<std::vector<int>> Members(int64_t iteration, int num_workers) override;

  // The job run every later registration proposes (proto
  // RegisterRequest.job_run; "": none). A server without a run adopts it.
  // Not thread-safe: call with no call in flight.
  void ProposeJobRun(std::string job_run) { job_run_ = std::move(job_run); }
  // Asks the server to go back to its checkpoint of `version` (proto
  // RestoreRequest), as this store's rank with its session; deadline
  // rpc_timeout. OK when the server is there already or will restart from
  // it (every session then dropped: the next call is ABORTED or
  // UNAVAILABLE, and Reconnect registers again). The server's errors, with
  // its address: kFailedPrecondition (no valid checkpoint of `version`:
  // the message lists the ones it has), kOutOfRange (past its version),
  // kInvalidArgument (below 0), and the codes IsServerLost accepts.
  absl::Status Restore(int64_t version);

  // The messages' ends. Push/PullSegments start their messages' calls at
  // once and return; done runs on a gRPC thread.
  std::vector<int64_t> SegmentEnds() const override;
  void PushSegments(int64_t iteration, int64_t num_samples, int first, int last,
                    absl::Span<const float> gradient, Done done) override;
  void PullSegments(int64_t version, int first, int last, absl::Span<float> params,
                    Done done) override;

  // Bytes of tensor data so far (payload as encoded, not framing):
  // gradients pushed, and parameters pulled (the first pull of the initial
  // ones included).
  int64_t bytes_pushed() const { return bytes_pushed_; }
  int64_t bytes_pulled() const { return bytes_pulled_; }
  // Whether the last registration's server mapped this store's shared
  // memory (RemoteStoreOptions::shared_memory), so tensor bytes bypass TCP.
  bool uses_shared_memory() const { return use_segment_; }
  // Whether Register sent this worker's initial parameters.
  bool sent_initial_parameters() const { return sent_initial_parameters_; }
  // Asynchronous consistency: how many pushes (messages) were how stale,
  // as the server's replies said (updates their chunks received since the
  // version they were computed from). ssp:S: iterations behind (the
  // pushed iteration less the least version its message's parameters came
  // from; 0 to S, all 0 under ssp:0).
  std::map<int64_t, int64_t> staleness_histogram() const;

 private:
  explicit RemoteParameterStore(const RemoteStoreOptions& options);

  // A chunk of the flat buffer: key, index within the key, element range.
  struct Chunk {
    int key;
    int64_t index;
    int64_t offset;  // into the flat buffer
    int64_t length;
    int64_t scratch_offset = 0;  // of its encoded bytes in push_scratch_
  };
  using Message = std::vector<Chunk>;

  class Batch;

  // Issues one call of `method` per message in [first, last) of messages_,
  // all at once, returns at once, and runs `done` when every reply has
  // arrived and gRPC has let go of every slice lent to it. `fill(m, lend)`
  // makes message m's request; `lend(bytes, size)` makes a slice over bytes
  // the caller keeps unchanged until `done`. `check(m, reply)` (may be empty)
  // vets and reads message m's reply on its completion thread. The first
  // error is done's status, naming `what` and the message's first chunk; a
  // `kind` event is reported per message when an observer is set. Each call's
  // deadline is `timeout` from its start.
  using Lend = std::function<grpc::Slice(const void*, size_t)>;
  void StartMessages(const char* what, const char* method, EventKind kind, int64_t step,
                     int first, int last, absl::Duration timeout,
                     std::function<grpc::ByteBuffer(size_t, const Lend&)> fill,
                     std::function<absl::Status(size_t, const grpc::ByteBuffer&)> check,
                     Done done);
  // Starts sending messages [first, last) of `flat` (a model's worth) as
  // framed chunks: `header(h)` fills each message's header fields besides
  // its chunks; the data slices point into `flat`.
  // `codec`: how the data travels; a codec other than none encodes each
  // chunk into push_scratch_ first and lends that.
  template <typename Header>
  void SendFrames(const char* what, const char* method, int64_t step, int first, int last,
                  absl::Span<const float> flat, const WireCodec& codec,
                  std::function<void(Header*)> header,
                  std::function<absl::Status(size_t, const grpc::ByteBuffer&)> check, Done done);
  // Reads a push reply's announced members.
  absl::Status ReadPushReply(const grpc::ByteBuffer& reply);
  // Starts pulling messages [first, last) into `params`; done gets the
  // version every reply carried (kInternal when they differ, or when
  // `exact` and it is not `version`).
  void StartPull(int64_t version, int first, int last, absl::Span<float> params, bool exact,
                 std::function<void(absl::StatusOr<int64_t>)> done);
  // StartPull's steps.
  // Message m's request for version `asked` or later (exactly `asked`
  // when `exact` and the consistency pulls exactly), as a delta when this
  // store holds version asked - 1 of it, into shared memory when pulls go
  // there.
  grpc::ByteBuffer PullRequestFor(size_t m, int64_t asked, int64_t timeout_ms, bool exact);
  // Checks message m's reply `frame` and copies its chunks into `params`,
  // adding their data bytes to `received` as it goes; then sets
  // `reply_version` to the version it carried and notes it
  // (NotePulledReply). kInternal, naming what the server sent, for a
  // malformed reply, a wrong number of chunks, another version than
  // `version` when `exact`, or a chunk ReadPulledChunk refuses; the chunks
  // before a refused one are already in `params`. On a gRPC completion
  // thread, concurrently for different messages.
  absl::Status ReadPullReply(size_t m, const grpc::ByteBuffer& frame, int64_t version,
                             bool exact, absl::Span<float> params, int64_t* reply_version,
                             std::atomic<int64_t>* received);
  // Applies one pulled chunk `got` (its bytes `pieces`) to `chunk`'s range
  // of `params`: a delta added, or dense values copied out of the reply,
  // out of shared memory, or decoded by pull_codec_. kInternal when it is
  // not the chunk asked for, in the form asked for.
  absl::Status ReadPulledChunk(const proto::TensorChunk& got, const Chunk& chunk,
                               absl::Span<const absl::string_view> pieces,
                               absl::Span<float> params);
  // What a wholly applied reply of message m tells this store: the version
  // `buffer` now holds of it (delta pulls), the newest loss scale, and the
  // version its next push is computed from (staleness reports).
  void NotePulledReply(size_t m, const proto::PullReply& reply, const float* buffer);
  // The version a pull whose messages carried `versions` brought: the
  // least of them when pulls are not exact; else their one version, or
  // kInternal when they differ or, with `exact`, it is not `version`.
  // `version` when there are no messages.
  absl::StatusOr<int64_t> PulledVersion(const std::vector<int64_t>& versions, int64_t version,
                                        bool exact) const;
  // kInvalidArgument unless [first, last) is a range of messages and `size`
  // is the model's.
  absl::Status CheckSegments(const char* what, int first, int last, size_t size) const;
  absl::Status SendInitialParameters(absl::Span<const float> proposed);
  // Register's call, repeated with bounded exponential back-off (100 ms
  // doubling to 2 s) while the server is unreachable, until `timeout`;
  // each wait is logged.
  absl::StatusOr<Registration> RegisterRetrying(const std::vector<ParamSpec>& signature,
                                                absl::Span<const float> proposed,
                                                absl::Duration timeout, bool reconnecting);
  // One Register call (deadline `deadline`, a wall-clock time for gRPC).
  absl::StatusOr<Registration> RegisterOnce(const std::vector<ParamSpec>& signature,
                                            absl::Span<const float> proposed,
                                            absl::Time deadline);
  // RegisterOnce's steps, in its order.
  // The request's worker id, requested rank, steps per epoch and signature.
  proto::RegisterRequest MakeRegisterRequest(const std::vector<ParamSpec>& signature) const;
  // Whether shared memory is offered (options_.shared_memory with a dense
  // F32 codec); if so replaces segment_ by a fresh segment for `signature`
  // and states it in `request`. The segment's error when it cannot be made.
  absl::StatusOr<bool> OfferSharedMemory(const std::vector<ParamSpec>& signature,
                                         proto::RegisterRequest* request);
  // The reply's consistency; the error RegisterOnce returns, changing
  // nothing, when the consistency is unknown (its code), the optimizer
  // unknown (kFailedPrecondition), the reply malformed (kInternal) or its
  // loss scaling impossible with a sparse codec (kInvalidArgument).
  absl::StatusOr<WorkerConsistency> CheckRegisterReply(const proto::RegisterReply& reply) const;
  // Takes the reply's rank, shared memory (if `offered`; logged) and
  // session, and starts the heartbeat thread if it is not running.
  void AdoptSession(const proto::RegisterReply& reply, bool offered);
  // Rebuilds messages_ (and their sizes, key names, num_parameters_, the
  // push scratch and a zero residual) for `signature` cut into chunks of
  // `chunk_elements` (>= 1).
  void LayOutMessages(const std::vector<ParamSpec>& signature, int64_t chunk_elements);
  // The registration the caller gets; resets the loss scale, consistency,
  // pulled and held versions and announced members to the reply's.
  Registration AdoptRegistration(const proto::RegisterReply& reply,
                                 const WorkerConsistency& consistency);
  // The job token and (after Register) the session, on every call.
  void AddCredentials(grpc::ClientContext* context) const;
  // The heartbeat thread's loop (started by the first registration).
  void SendHeartbeats();

  RemoteStoreOptions options_;
  // options_.observer on options_.clock, for the messages' events.
  EventTimer events_;
  // options_.connections connections each for pushes (and Initialize) and
  // for pulls (see Create); Register and Wait use the first push one.
  std::vector<std::shared_ptr<grpc::Channel>> push_channels_, pull_channels_;
  std::vector<std::unique_ptr<grpc::GenericStub>> push_stubs_, pull_stubs_;
  std::unique_ptr<proto::ParameterServer::Stub> stub_;
  // Chunks grouped into messages of at most chunk_elements elements: many
  // small tensors share a message, a large one has one message per chunk.
  std::vector<Message> messages_;
  std::vector<int64_t> message_elements_;  // per message
  std::vector<std::string> key_names_;     // the signature's, for events
  int64_t num_parameters_ = 0;
  int rank_ = -1;
  std::unique_ptr<WireCodec> codec_;  // options_.compression's, for pushes
  std::unique_ptr<WireCodec> exact_;  // none: the initial parameters
  const WireCodec* pull_codec_ = nullptr;  // codec_, or exact_ for a sparse one
  // Delta pulls (a sparse push codec under sync; PullRequest.delta): the
  // version of each message that `held_buffer_` holds after its last pull
  // there (-1: unknown), so the next pull of version + 1 asks only for
  // what changed. Reset by each registration.
  bool delta_pulls_ = false;
  absl::Mutex held_mu_;
  std::vector<int64_t> held_version_ ABSL_GUARDED_BY(held_mu_);
  const float* held_buffer_ ABSL_GUARDED_BY(held_mu_) = nullptr;
  // Error feedback of a sparse codec: per element, what earlier pushes
  // have not sent yet (a model's worth of fp32; empty for dense codecs).
  // Each segment's part is touched only by that segment's push, which the
  // scheduler never has in flight twice.
  std::vector<float> residual_;
  // Encoded gradients, a model's worth, when the codec is not none: each
  // message's chunks are encoded at their flat offset (so messages in
  // flight at once never share bytes) and lent to gRPC from here.
  std::vector<char> push_scratch_;
  // Shared memory (options_.shared_memory): a fresh one offered at every
  // registration; use_segment_ while the server has it mapped. Bytes [4 o, 4 (o + n)) of its data area carry the push of
  // flat elements [o, o + n), and the same range 4 x num_parameters_
  // further on their pull, so messages in flight never share bytes.
  std::unique_ptr<SharedMemorySegment> segment_;
  bool use_segment_ = false;
  // Whether pulls go through segment_ (dense F32, not delta), and where in
  // it the pull of `chunk` lands.
  bool PullsIntoSharedMemory() const {
    return use_segment_ && pull_codec_->dtype() == DType::kF32 && !delta_pulls_;
  }
  int64_t PullOffset(const Chunk& chunk) const {
    return static_cast<int64_t>(sizeof(float)) * (num_parameters_ + chunk.offset);
  }
  // The server's consistency, from the registration.
  WorkerConsistency consistency_;
  // Dynamic loss scaling: the newest scale the server sent, and its version.
  mutable absl::Mutex loss_scale_mu_;
  float loss_scale_ ABSL_GUARDED_BY(loss_scale_mu_) = 0;
  int64_t loss_scale_version_ ABSL_GUARDED_BY(loss_scale_mu_) = -1;
  // Under a policy that reports staleness (WorkerConsistency): per message,
  // the version its last pull brought (the version its next push is
  // computed from), and the staleness replies; under one with stale pulls,
  // the versions pulls in flight ask for (how many each), which the
  // heartbeat thread reads to say whom a held-back step waits for.
  mutable absl::Mutex staleness_mu_;
  std::vector<int64_t> pulled_version_ ABSL_GUARDED_BY(staleness_mu_);
  std::map<int64_t, int64_t> staleness_ ABSL_GUARDED_BY(staleness_mu_);
  std::map<int64_t, int> pulls_in_flight_ ABSL_GUARDED_BY(staleness_mu_);
  // The last registration's credential and rank, as the heartbeat thread
  // reads them. Written only in Register and Reconnect, under the lock,
  // when no segment call is in flight; the calls that thread and those
  // started from gRPC's threads later read session_ unlocked.
  mutable absl::Mutex session_mu_;
  std::string session_;
  int session_rank_ ABSL_GUARDED_BY(session_mu_) = -1;
  // Announced members by iteration (Members), from registrations and push
  // replies; the last few kept.
  absl::Mutex members_mu_;
  std::map<int64_t, std::vector<int>> members_ ABSL_GUARDED_BY(members_mu_);
  // Set by the destructor; the heartbeat thread sleeps on options_.clock
  // with it as its condition, so that it wakes at once.
  absl::Mutex heartbeats_mu_;
  bool stop_heartbeats_ ABSL_GUARDED_BY(heartbeats_mu_) = false;
  std::thread heartbeats_;
  std::atomic<int64_t> bytes_pushed_{0};
  std::atomic<int64_t> bytes_pulled_{0};
  bool sent_initial_parameters_ = false;
  std::string job_run_;  // proposed at registration (ProposeJobRun)
};

}  // namespace ps::worker

#endif  // PS_WORKER_REMOTE_PARAMETER_STORE_H_
