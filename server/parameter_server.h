#ifndef PS_SERVER_PARAMETER_SERVER_H_
#define PS_SERVER_PARAMETER_SERVER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "common/cpu_device.h"
#include "common/f32_pieces.h"
#include "common/optimizer/loss_scale.h"
#include "common/optimizer/optimizer.h"
#include "common/param_spec.h"
#include "common/push_checks.h"
#include "common/timed_event.h"
#include "server/consistency/consistency.h"
#include "server/initial_values.h"
#include "server/job_progress.h"
#include "server/membership.h"
#include "server/parameter_table.h"
#include "server/rank_order_sum.h"
#include "server/sessions.h"
#include "server/state_capture.h"

namespace ps::server {

struct ParameterServerOptions {
  // Workers that take part in every synchronous iteration.
  int num_workers = 1;
  // How pushes become updates: sync (the iterations described below, the
  // default, and the equivalence with one device's SGD), async (every push
  // applied as it arrives, scaled by its own samples, each chunk's version
  // advancing per update; a pull of version 0 returns the newest
  // parameters) or ssp:S (the iterations of sync, up to S + 1 of them in
  // flight at once; see "Stale synchronous parallel" below). Never null
  // (kInvalidArgument). See server/consistency/consistency.h.
  std::shared_ptr<const Consistency> consistency = SyncConsistency();
  OptimizerOptions optimizer;
  // Dynamic loss scaling (common/optimizer/loss_scale.h), only under a
  // policy that supports it (sync; Create refuses it otherwise). Workers multiply their loss by loss_scale() (the scale
  // of the step they compute, published with the parameters) and push the
  // scaled gradients. A chunk pushed with a value that is not finite is an
  // overflow then, not an error: every update of that chunk in the
  // iteration is skipped (its parameters and momentum stay, its version
  // advances), and a worker that overflowed anywhere pushes every chunk
  // non-finite (the trainer does), so every chunk of the iteration is
  // skipped on every shard. No non-finite value reaches the parameters.
  LossScaleOptions loss_scale;
  // Gradients and parameters move in chunks of at most this many elements
  // per key, which bounds every message: the default keeps a chunk's whole
  // message (data plus a few fields) inside gRPC's default 4 MiB limit.
  int64_t chunk_elements = kDefaultChunkElements;
  static constexpr int64_t kDefaultChunkElements = ((int64_t{4} << 20) - 4096) / 4;
  // Receives the server's timed events (common/timed_event.h), each timed
  // from when the call holds the server's bookkeeping lock (waiting for it
  // is not the work) and reported only when the call's part so far
  // succeeded (kServerPush once the message is summed, before its updates):
  //   - kServerPush on ServerPushLane(rank) per PushChunks (or Push) call:
  //     checking and summing one message (with any wait for a chunk's lock
  //     held by another worker's push of that chunk); step: its iteration,
  //     name: its first chunk's tensor, bytes: its payload;
  //   - kServerUpdate on kServerUpdateLane per chunk applied, after the
  //     kServerPush of the message that completed it (every worker has
  //     pushed it): the optimizer step on that chunk and publishing it;
  //     step: the iteration, name: the chunk's tensor, bytes: the chunk's
  //     parameters (0 for an empty tensor's). Total chunks per iteration
  //     of them, the last one also publishing the version; each reported
  //     as its chunk is published, under the bookkeeping lock, so once a
  //     version (or chunk version) is visible its update events are in;
  //   - kServerPull on kServerPullLane per PullChunks, PullChunkViews (or
  //     Pull) call: the copy out (or taking the views), after the wait;
  //     step: the version returned, name: its first chunk's tensor, bytes:
  //     its payload.
  // Pushes of different chunks and pulls run at once, so events may
  // overlap in time, and OnEvent is called from the pushing and pulling
  // threads concurrently; it must not call back into the server.
  // Null: no events. Both must outlive the server; clock is never null
  // when observer is set (kInvalidArgument).
  EventObserver* observer = nullptr;
  const Clock* clock = Clock::Real();
};

// The parameter server's state machine, free of any transport: the gRPC
// service (and tests) translate calls into these methods. It coordinates
// its components, each in a header of its own with its contract:
//   - ChunkLayout and ChunkBuffers (parameter_table.h): the fp32 parameters
//     laid out flat in signature order and cut into chunks (per key,
//     chunk_elements each), current and previous versions, copy on write;
//   - RankOrderSum (rank_order_sum.h): each chunk's gradients summed in rank
//     order whatever order the pushes arrive in, so a rerun or a recovery
//     is bit-identical (held_elements() counts the parts held early);
//   - Membership (membership.h): who takes part in each iteration as the
//     job shrinks and grows back;
//   - the Consistency policy (consistency/consistency.h: sync, async,
//     ssp:S, whose files say what each promises), the optimizer and the
//     loss scale (common/optimizer/), the push checks (common/push_checks.h).
// As soon as every worker has pushed chunk c of an iteration, that chunk is
// updated (scaled by the samples all the pushes cover) and published, so
// workers that push layer by layer pull the first layers back while the
// last are still being pushed; the result is bit for bit that of one update
// of the whole vector (SgdOptimizer::ApplyRange).
//
// Versions: version v is the parameters after v updates; iteration v is the
// step computed from version v, whose pushes produce version v + 1. Each
// chunk has a version of its own too: v + 1 as soon as iteration v has
// applied it, while the server's version() is still v. PullChunks and
// PullChunkViews wait for chunk versions; Pull, WaitForVersion and
// HasVersion for the server's version (every chunk).
//
// Memory: the parameters and their previous version, the momentum, one
// gradient sum per iteration in flight (the policy's Window()), the parts
// held early (at most num_workers - 1 models per iteration when pushes
// arrive in reverse rank order), and a chunk's copy per update of a chunk
// a ChunkViews holder still views.
//
// The server knows no model: the signature comes from the first worker to
// register, and every other worker's must equal it. The initial parameters
// come from the values given to Create (a checkpoint, or --init_weights
// matched by name), or from rank 0, which Register asks to send them
// (InitializeChunks). Version 0 exists once they are all there.
//
// Every method is thread-safe. Bad input never changes state: a rejected
// push leaves the pending sums and the parameters untouched.
//
// Locks: one bookkeeping lock (mu_) over the short work (registration,
// which chunks each worker has pushed, the published versions, version 0's
// assembly) and one lock per chunk over the heavy work on it (summing,
// holding early parts, the optimizer step, copy on write, views). A push
// (1) checks its message under mu_ without reading its values, (2) checks
// the values under no lock, (3) claims its chunks under mu_ after checking
// again what a concurrent message of the same worker may have changed,
// (4) sums each chunk under that chunk's lock and (5) applies each chunk it
// completed under that chunk's lock and publishes it under mu_. So pushes
// of different chunks run at once (server/parameter_server_benchmark: on 2
// cores, 4 workers x 16 chunks of 4 MB, 17 GB/s from one thread and 27 GB/s
// from two, against 17 and 17 under one lock). Lock order: a chunk's lock
// may be taken while holding mu_, never mu_ while holding a chunk's lock; at
// most one chunk's lock at a time; device_mu_ (the optimizer's device)
// under a chunk's lock, and no lock under it.
class ParameterServer {
 public:
  // A server without parameters: rank 0 will send them. `device` runs the
  // optimizer and must outlive the server.
  static absl::StatusOr<std::unique_ptr<ParameterServer>> Create(
      const ParameterServerOptions& options, CpuDevice* device);
  // A server that starts from `initial` (flat, in `signature` order): every
  // worker's signature must equal `signature`.
  static absl::StatusOr<std::unique_ptr<ParameterServer>> Create(
      const ParameterServerOptions& options, std::vector<ParamSpec> signature,
      std::vector<float> initial, CpuDevice* device);
  // A server that starts from tensors matched by name to the first worker's
  // signature (its shapes must agree; tensors the signature does not name,
  // such as batch-norm buffers, are ignored). kInvalidArgument for a
  // non-finite value or a size that does not match its shape.
  static absl::StatusOr<std::unique_ptr<ParameterServer>> CreateFromNamedTensors(
      const ParameterServerOptions& options, std::vector<NamedTensor> initial,
      CpuDevice* device);

  // The server's whole state at a version boundary, as a checkpoint holds
  // it (server/state_capture.h).
  using State = ServerState;
  // A server resumed from `state` (a checkpoint): version `state.version`
  // exists at once, with the learning-rate schedule at that update and the
  // momentum buffer restored, so the next updates are bit for bit those
  // the saved server would have made. Workers must state the same signature
  // and steps per epoch. kInvalidArgument for sizes that do not match the
  // signature, a momentum buffer without momentum (or none with it), a
  // non-finite value or a negative version.
  static absl::StatusOr<std::unique_ptr<ParameterServer>> CreateFromState(
      const ParameterServerOptions& options, State state, CpuDevice* device);

  // Calls `done` exactly once with the state at the first version boundary
  // from now: on this thread at once when the iteration in progress has
  // completed no chunk yet (nothing of it has been applied), otherwise on
  // the thread of the push that completes the iteration, just before the
  // new version is published (so no update can run meanwhile). Under ssp:S
  // with S > 0 the updates of the next iterations wait meanwhile (their
  // pushes are still accepted and summed) so that no chunk is ahead of the
  // captured version; they are applied right after the capture. Copies the
  // parameters and momentum (two models of memory, a few milliseconds per
  // 10M parameters) under the bookkeeping lock. Before version 0 exists the
  // request waits for version 1. `done` must not call back into the server.
  // Requests made before one is served are served together.
  void CaptureState(std::function<void(State)> done);
  // How many times the updates a capture held back were applied together
  // (the capture served, or CancelCaptures): each may have published
  // chunks no call of their own sent, so a caller answering waiting pulls
  // by the chunks a call sent looks at every waiting pull when this moves.
  // Counted once those updates are published.
  int64_t held_back_releases() const;
  // Drops the CaptureState requests not yet served (their `done` is never
  // called); returns how many.
  int CancelCaptures();

  struct Registration {
    int rank = 0;
    int num_workers = 1;
    int64_t version = 0;
    int64_t chunk_elements = 0;
    // This worker must send the initial parameters with InitializeChunks
    // before anyone can pull version 0: it has rank 0 and the server has
    // none yet.
    bool send_initial_parameters = false;
    // The worker's credential for acting as `rank` (CheckSession): this
    // server's incarnation and a random secret, new at every registration.
    std::string session;
    // The ranks taking part in iteration `version` (Members).
    std::vector<int> members;
  };

  // Registers worker `worker_id` with its model's signature. The worker gets
  // `requested_rank` if it is >= 0, else the lowest free rank. Registering
  // the same worker_id again returns its existing rank (a restarted worker).
  // `steps_per_epoch` is the number of iterations in one epoch of the
  // workers' data (0: not stated); all workers must state the same, and a
  // schedule in epochs needs it.
  //
  // Rejoining: a worker that registers again while an iteration is in
  // progress (its process restarted) resumes at that iteration (the
  // version returned; pull it exactly, see PullChunkViews). What its
  // previous process already pushed of the iteration is counted once: the
  // same chunks pushed again are accepted and dropped, since a worker's
  // gradient is a function of the version and the step (same parameters,
  // same data), so the sum is bit for bit that of a run without the
  // restart. The previous process's session stops working.
  //
  // Errors: kFailedPrecondition when the signature differs (the message names
  // the first difference), when the named initial tensors lack one of its
  // parameters or disagree on a shape, when steps_per_epoch differs from
  // the other workers' or is missing for an epoch schedule;
  // kResourceExhausted when num_workers others are registered;
  // kAlreadyExists when the requested rank is another worker's;
  // kInvalidArgument for an empty id, a rank out of range or an empty or
  // non-F32 signature.
  absl::StatusOr<Registration> Register(const std::string& worker_id,
                                        const std::vector<ParamSpec>& signature,
                                        int requested_rank = -1, int64_t steps_per_epoch = 0);

  // Whether `session` is the credential the last registration of `rank`
  // returned. kAborted when it comes from another incarnation of the
  // server (this process restarted since: the worker must register again
  // and resume from the server's version) or is empty; kPermissionDenied
  // when it is this incarnation's but not `rank`'s (another worker's, or a
  // previous process of this one); kNotFound for a rank no worker holds.
  // The transport checks it before a push or initial value is applied.
  absl::Status CheckSession(int rank, absl::string_view session) const;
  // CheckSession's first check alone: kAborted unless `session` is of this
  // incarnation (for calls that act as no rank).
  absl::Status CheckIncarnation(absl::string_view session) const;
  // This server process's random identity, the prefix of its sessions.
  const std::string& incarnation() const { return sessions_.incarnation(); }

  // A sign of life from the worker of `rank` (its session checked as in
  // CheckSession): registering and pushing count too. What the job's
  // progress (below) says of when each worker was last heard from.
  absl::Status Heartbeat(int rank, absl::string_view session);

  // Where the job stands, for stall reports and liveness: the version, since
  // when it exists, and per rank what it did (server/job_progress.h).
  using WorkerProgress = server::WorkerProgress;
  using Progress = JobProgress;
  Progress progress() const;

  // Adds chunk `chunk` of key `key` (elements [chunk * chunk_elements, ...)
  // of that parameter) of the gradient of worker `rank`, computed at
  // `iteration` over `num_samples` samples (the same for all of that worker's
  // chunks of the iteration; 0 for a worker whose shard was empty).
  // Errors, each leaving all state untouched: kNotFound unknown rank,
  // kOutOfRange key or chunk out of range, kInvalidArgument wrong chunk length
  // or a non-finite value (named), kFailedPrecondition iteration is not the
  // current one (under ssp:S: is past, or the server is asynchronous) or
  // num_samples differs from this worker's earlier chunks of the iteration,
  // kOutOfRange under ssp:S for an iteration beyond version() + S (ahead of
  // the staleness bound: the message names the bound and the ranks the
  // iteration in progress waits for), kAlreadyExists the chunk was already
  // pushed this iteration (even when every worker has pushed it and it has
  // been applied).
  absl::Status Push(int rank, int64_t iteration, int key, int64_t chunk, int64_t num_samples,
                    absl::Span<const float> gradient);
  // The most workers a server takes (Create: kInvalidArgument beyond); with
  // kMaxSamplesPerPush (common/push_checks.h) the sum of the samples over
  // the workers stays inside int64.
  static constexpr int kMaxWorkers = 1 << 22;
  // A signature's tensors and their sum stay below this many elements
  // (kInvalidArgument at registration otherwise; 4 TiB of fp32), so sizes
  // derived from it cannot overflow.
  static constexpr int64_t kMaxParameters = int64_t{1} << 40;

  // Several chunks at once, all or nothing: every chunk is checked (as in
  // Push, and for repeats within `chunks`) before any is added.
  struct ChunkData {
    int key = 0;
    int64_t chunk = 0;
    absl::Span<const float> data;
  };
  absl::Status PushChunks(int rank, int64_t iteration, int64_t num_samples,
                          absl::Span<const ChunkData> chunks);

  // A chunk whose F32 elements lie, little-endian, in consecutive byte
  // ranges (a received message's slices read in place; server/f32_pieces.h):
  // any alignment, an element may straddle two pieces. The pieces are read
  // during the call only.
  struct ChunkBytes {
    int key = 0;
    int64_t chunk = 0;
    absl::Span<const absl::string_view> pieces;
  };
  // PushChunks and InitializeChunks over such chunks, with the same checks,
  // errors and all-or-nothing rule (a byte count that is not 4 x the chunk's
  // length is kInvalidArgument); the Span forms above call these.
  absl::Status PushChunkBytes(int rank, int64_t iteration, int64_t num_samples,
                              absl::Span<const ChunkBytes> chunks);
  // Asynchronous consistency only (kFailedPrecondition otherwise): applies
  // worker `rank`'s gradient chunks at once, each an SGD update of its
  // chunk scaled by `num_samples` (0: nothing applied), in message order,
  // under the chunk's lock; the learning-rate schedule counts a chunk's
  // updates divided by the workers. Returns the push's staleness: how many
  // updates its chunks received since version `based_on_version` (the
  // version of the parameters the worker computed it from; the largest over
  // its chunks). Checks as PushChunks (but a chunk may come again: every
  // push is an update), all or nothing.
  absl::StatusOr<int64_t> ApplyNow(int rank, int64_t based_on_version, int64_t num_samples,
                                   absl::Span<const ChunkBytes> chunks);
  absl::Status InitializeChunkBytes(int rank, absl::Span<const ChunkBytes> chunks);

  // Chunks of the initial parameters from the worker Register told to send
  // them, all or nothing per call; version 0 is published when the last
  // chunk arrives. Errors, each leaving all state untouched: kNotFound
  // unknown rank, kFailedPrecondition when this worker was not asked to
  // send them (or they are complete), kOutOfRange / kInvalidArgument /
  // kAlreadyExists for a chunk as in PushChunks.
  absl::Status InitializeChunks(int rank, absl::Span<const ChunkData> chunks);

  // The twin of PullChunkViews that copies, for tests: same wait, checks,
  // errors, version returned and event, then each chunk (key, chunk index)
  // is copied into its `out`, which must be exactly the chunk's length
  // (kInvalidArgument otherwise, after the wait; then nothing is copied).
  struct ChunkOut {
    int key = 0;
    int64_t chunk = 0;
    absl::Span<float> out;
  };
  absl::StatusOr<int64_t> PullChunks(int64_t version, absl::Time deadline,
                                     absl::Span<const ChunkOut> chunks);

  // Waits until every requested chunk (key, chunk index) has chunk version
  // >= `version` (or `deadline` passes: kDeadlineExceeded, naming a chunk
  // still missing and its version) and returns views of their current
  // parameters, copying nothing, with the smallest of their chunk versions
  // (>= `version`; a chunk may be one newer when its update of the next
  // iteration has already been applied, which a synchronous worker that
  // pulls before it pushes never sees). An empty request waits for the
  // server's version and returns it, like WaitForVersion. Before version 0
  // exists every request waits for it. kOutOfRange for a chunk that does
  // not exist, at once, without waiting (before the first registration
  // states the signature, no chunk is known and the request waits for
  // version 0 first).
  //
  // The views stay valid and unchanged while `keep_alive` (or a copy of it)
  // lives, from any thread: it keeps the viewed chunks' buffers alive, and
  // an update of a chunk still viewed writes a fresh copy of that chunk
  // instead (copy on write, per chunk), so holding views costs up to one
  // copy of each viewed chunk per update it is held across, and nothing
  // once the last holder lets go before the chunk's next update.
  // Reports kServerPull.
  struct ChunkId {
    int key = 0;
    int64_t chunk = 0;
  };
  struct ChunkViews {
    int64_t version = 0;
    std::shared_ptr<const void> keep_alive;
    std::vector<absl::Span<const float>> chunks;  // in request order
    // With `with_previous`: for each chunk viewed at exactly `version`, its
    // parameters of version - 1 (what a worker that pulled version - 1
    // holds, so that a pull can send only what changed); empty where the
    // chunk is at another version or has no previous one kept.
    std::vector<absl::Span<const float>> previous;
  };
  //
  // `exact`: every chunk exactly at `version`, even one whose update of
  // iteration `version` is already applied (its previous parameters are
  // kept until its next update: one model's memory, and a copy of each
  // chunk per update instead of updating in place): what a worker that
  // rejoins mid-iteration needs to recompute that iteration. The views'
  // version is then `version`; kFailedPrecondition, after the wait, for a
  // chunk more than one update ahead.
  absl::StatusOr<ChunkViews> PullChunkViews(int64_t version, absl::Time deadline,
                                            absl::Span<const ChunkId> chunks,
                                            bool exact = false, bool with_previous = false);
  // Whether PullChunkViews(version, ..., chunks) would return without
  // waiting: every chunk has its version (or the request is empty and the
  // server has it), or some chunk does not exist (the pull answers with
  // its error at once).
  bool HasChunks(int64_t version, absl::Span<const ChunkId> chunks) const;
  // Whether version `version` exists (WaitForVersion and Pull would return
  // without waiting).
  bool HasVersion(int64_t version) const;

  // Waits until the server's version is at least `version` (every chunk
  // has been applied `version` times; kDeadlineExceeded after `deadline`)
  // and returns the current version, copying nothing.
  absl::StatusOr<int64_t> WaitForVersion(int64_t version, absl::Time deadline);

  // Waits like WaitForVersion and copies all parameters at once into `out`
  // (flat in signature order, exactly num_parameters() elements:
  // kInvalidArgument otherwise). Returns the server's version; every chunk
  // copied is at least that version (some may be one newer, as in
  // PullChunkViews).
  absl::StatusOr<int64_t> Pull(int64_t version, absl::Time deadline, absl::Span<float> out);

  // Shrinking the job (--on_worker_loss=shrink): takes `rank` out. The
  // iteration in progress goes on without the parts the rank has not pushed
  // (each such chunk is updated with the gradients that did arrive, scaled
  // by the samples they cover), and so does the next one if its membership
  // was already announced with the rank in it; from the first iteration
  // announced after this, the rank is no member, and the workers split the
  // global batch over the members (Members). Its pushes are refused with
  // kAborted (register again). A worker registering again as this rank
  // joins at the first iteration whose membership is not announced yet:
  // Register's version is that iteration (kUnavailable "try again" while
  // the next iteration's is announced without it). Returns the chunks the
  // drop completed (their waiting pulls can be answered). kNotFound for a
  // rank no worker holds; kFailedPrecondition for the last member, and
  // under ssp:S with S > 0 (several iterations in flight, each with its
  // members: not supported) and under async (no iterations, nobody waits
  // for a lost worker: nothing to shrink).
  absl::StatusOr<std::vector<ChunkId>> DropWorker(int rank);

  // The ranks taking part in iteration `iteration`, ascending: a worker's
  // part of the global batch is its index among them, of as many parts.
  // Known for the current iteration and, once a member has pushed part of
  // the current one (or a dropped worker rejoined), for the next: announced,
  // it no longer changes. kUnavailable for an iteration not announced yet,
  // kOutOfRange for a past one.
  absl::StatusOr<std::vector<int>> Members(int64_t iteration) const;

  // The signature (empty until known) and current version.
  std::vector<ParamSpec> signature() const;
  int64_t version() const;

  // Dynamic loss scaling (options.loss_scale): the scale workers multiply
  // the loss by for iteration `version` (the server's version when read),
  // and how many iterations were skipped for an overflow so far. scale is
  // 0 without dynamic loss scaling.
  struct LossScale {
    int64_t version = 0;
    float scale = 0;
    int64_t skipped_iterations = 0;
  };
  LossScale loss_scale() const;
  // The workers' steps per epoch (-1 before the first registration).
  int64_t steps_per_epoch() const;
  // Whether the initial parameters are complete (version 0 exists).
  bool initialized() const;
  // Gradient elements held for their rank's turn in the sum, this iteration.
  int64_t held_elements() const;
  int64_t num_parameters() const;
  // Number of chunks key `key` is cut into (0 for an unknown key).
  int64_t NumChunks(int key) const;
  // Elements in chunk `chunk` of key `key`; -1 when either is out of range.
  int64_t ChunkLength(int key, int64_t chunk) const;
  const ParameterServerOptions& options() const { return options_; }

 private:
  // One iteration's aggregation of one chunk: the rank-order sum of the
  // workers' parts, how many workers pushed it (counted apart from the sum,
  // which an empty tensor's chunk never advances) and the samples their
  // pushes cover.
  struct Aggregation {
    RankOrderSum sum;
    int pushes = 0;
    int64_t samples = 0;
    // Dynamic loss scaling: a push of this chunk was not finite (nothing
    // more is summed; the update is skipped).
    bool overflow = false;
  };

  // One chunk: its parameters and the aggregations of the iterations in
  // flight, under the chunk's own lock (see "Locks" above).
  struct Chunk {
    absl::Mutex mu;
    // Its parameters, current and previous (kept for exact pulls), in
    // buffers of its own shared with the ChunkViews handed out, so that an
    // update copies only a chunk that a view still holds.
    ChunkBuffers buffers ABSL_GUARDED_BY(mu);
    // Updates applied to the parameters (published to chunk_version_ just after).
    int64_t version ABSL_GUARDED_BY(mu) = 0;
    // Iteration k's aggregation is slots[k % window_] (one slot but under
    // ssp:S, where iterations version_ .. version_ + S are in flight);
    // asynchronous updates use slots[0].sum's buffer as their scratch.
    std::vector<Aggregation> slots ABSL_GUARDED_BY(mu);
    // Ranks whose part of this chunk the iteration in progress does without
    // (dropped from the job, DropWorker; one slot only): skipped in the
    // rank order and counted as pushed.
    std::vector<bool> waived ABSL_GUARDED_BY(mu);
    int waived_count ABSL_GUARDED_BY(mu) = 0;
  };

  // The model laid out (server/parameter_table.h) with its chunks. Built
  // once, at the first registration, under mu_; from then on it never
  // changes, so a call that has read layout_ under mu_ reads the layout's
  // fields without it. Only `chunks` is mutable, each under its own lock.
  struct Layout : ChunkLayout {
    explicit Layout(ChunkLayout cut) : ChunkLayout(std::move(cut)) {}
    std::unique_ptr<Chunk[]> chunks;  // total_chunks of them
  };

  ParameterServer(const ParameterServerOptions& options, CpuDevice* device);

  // Takes `signature` as the job's: lays out keys and chunks, and the
  // initial values when the server was given some. State is unchanged on
  // error.
  absl::Status AdoptSignatureLocked(const std::vector<ParamSpec>& signature)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The checks of a push that need no chunk: the rank is registered,
  // version 0 exists, the iteration is the current one and num_samples is
  // in range and agrees with the worker's earlier pushes of
  // it (kFailedPrecondition).
  absl::Status CheckPushLocked(int rank, int64_t iteration, int64_t num_samples) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // PushChunkBytes' steps 1 and 2: the message checked against the
  // bookkeeping (under mu_) and its values (under no lock); sets the
  // layout, each chunk's global index and, under dynamic loss scaling,
  // which chunks overflowed.
  absl::Status CheckPushMessage(int rank, int64_t iteration, int64_t num_samples,
                                absl::Span<const ChunkBytes> chunks, const std::string& what,
                                int64_t* start_ns, const Layout** layout,
                                std::vector<int64_t>* global_chunks, std::vector<bool>* overflow)
      ABSL_LOCKS_EXCLUDED(mu_);
  // PushChunkBytes' step 3: checks again what a concurrent message of this
  // worker may have changed, then marks the chunks pushed; sets which were
  // carried from a previous process of the worker (not summed again).
  absl::Status ClaimChunksLocked(int rank, int64_t iteration, int64_t num_samples,
                                 absl::Span<const ChunkBytes> chunks,
                                 const std::vector<int64_t>& global_chunks,
                                 const std::string& what, std::vector<bool>* carried)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Checks every chunk of a message without reading its values (range,
  // length, not in `received` nor repeated within the message) and appends
  // each one's global index to `global_chunks`, stopping at the first that
  // fails, whose error it returns.
  absl::Status CheckChunkShapesLocked(absl::Span<const ChunkBytes> chunks,
                                      const std::vector<bool>& received, absl::string_view what,
                                      std::vector<int64_t>* global_chunks) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Checks the values of the first `count` chunks of a message (shapes
  // checked): kInvalidArgument naming the first non-finite one, or, given
  // `overflow` (dynamic loss scaling), a non-finite chunk marked there
  // instead. Reads only the message, so it needs no lock.
  static absl::Status CheckChunkValues(const Layout& layout, int64_t chunk_elements,
                                       absl::Span<const ChunkBytes> chunks, size_t count,
                                       std::vector<bool>* overflow = nullptr);
  // The kAlreadyExists of chunk `chunk`, already `what`.
  static absl::Status AlreadyError(const Layout& layout, const ChunkBytes& chunk,
                                   absl::string_view what);
  // Adds worker `rank`'s part of `chunk` to `agg`'s rank-order sum (one of
  // the chunk's slots), unless the iteration overflowed, counting what it
  // holds back in early_elements_.
  void SumLocked(int rank, Chunk& chunk, Aggregation& agg, F32Pieces part)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);
  // The end of iteration `iteration` (== version_), once its last chunk is
  // applied: the loss scale decides, the workers' pushes of it reset, the
  // version and the membership advance; at a capture's boundary the
  // pending captures are taken into *captures (with *state, to run outside
  // mu_) and *resume says whether updates were held back for them.
  void FinishIterationLocked(int64_t iteration, std::vector<std::function<void(State)>>* captures,
                             State* state, bool* resume) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Copies the current state at the boundary (every chunk at version_,
  // nothing of the iteration applied) for the capture requests.
  void CopyStateLocked(State* state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Global chunk `global_chunk` of iteration `iteration` has every
  // worker's part summed: marks it ready and applies what may be applied of
  // the chunk (AdvanceChunk).
  absl::Status CompleteChunk(const Layout& layout, SgdOptimizer* optimizer, int64_t iteration,
                             int64_t global_chunk) ABSL_LOCKS_EXCLUDED(mu_);
  // Applies the chunk's ready iterations in order, from its version on, up
  // to what the captures hold back: each claimed under mu_ (one thread at a time applies a
  // chunk; another finding it busy leaves its ready iteration to that one),
  // updated under the chunk's lock (ApplyAggregation), then published under
  // mu_; the last chunk of an iteration publishes version + 1 and resets
  // the iteration's slot (and serves the captures, releasing the updates
  // they held back).
  //
  // With `last` (a push's part that is the last term of iteration
  // last->iteration's sum, not added, see RankOrderSum::IsLastTerm): that update
  // reads it in place, if the chunk is at that iteration, no other thread
  // applies it and no capture holds it back; then *applied_last is set.
  // Otherwise nothing is done, and the caller adds the part and completes
  // the chunk as usual.
  struct LastTerm {
    int64_t iteration;
    F32Pieces pieces;
  };
  absl::Status AdvanceChunk(const Layout& layout, SgdOptimizer* optimizer, int64_t global_chunk,
                            const LastTerm* last, bool* applied_last) ABSL_LOCKS_EXCLUDED(mu_);
  // The optimizer step of iteration `iteration` on the chunk, from its
  // slot's sum (plus `last_term`, when not null: the sum's last term, not
  // added), which it resets; skipped (*skipped) for an overflow under loss
  // scaling. loss_scale is the iteration's (0: none).
  absl::Status ApplyAggregationLocked(const Layout& layout, SgdOptimizer* optimizer,
                                      int64_t iteration, int64_t global_chunk, float loss_scale,
                                      const F32Pieces* last_term, Chunk& chunk, bool* skipped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);
  // Iterations in flight at once: the policy's Window(): S + 1 under ssp:S, else 1.
  int64_t SlotOf(int64_t iteration) const { return iteration % window_; }
  // The ranks that have not pushed all of iteration version_ (for
  // refusals and stall lines).
  std::vector<int> RanksMissingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits (releasing mu_) until `version` exists; kDeadlineExceeded after
  // `deadline`.
  absl::Status AwaitVersionLocked(int64_t version, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The kDeadlineExceeded of a wait for `version` that is missing: it says
  // whether version 0 is still incomplete or where the server is.
  absl::Status VersionMissingErrorLocked(int64_t version) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // PullChunkViews' checks and wait (see there); returns each requested
  // chunk's global index, in request order.
  absl::StatusOr<std::vector<int64_t>> AwaitChunksLocked(int64_t version, absl::Time deadline,
                                                         absl::Span<const ChunkId> chunks)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether every chunk in `chunks` that exists has published chunk
  // version >= `version` (an empty request: the server's version), given
  // version 0 exists.
  bool ChunksReadyLocked(int64_t version, absl::Span<const ChunkId> chunks) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Global index of chunk `chunk` of key `key`, or -1 when either is out of
  // range or no model is known yet.
  int64_t GlobalChunkLocked(int key, int64_t chunk) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a registered worker holds `rank`.
  bool RankHeldLocked(int rank) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The global index of chunk `chunk` of key `key`: kOutOfRange naming the
  // key or chunk that does not exist, kFailedPrecondition before any model.
  absl::StatusOr<int64_t> FindChunkLocked(int key, int64_t chunk) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // options_.clock's reading when there is an observer, else 0 (no read).
  int64_t EventStartNanos() const;
  // options_.clock's reading (-1 without a clock).
  int64_t NowNanos() const;
  // Reports an event from `start_ns` to now to options_.observer, if any.
  void ReportEvent(EventKind kind, int32_t lane, int64_t step, absl::string_view name,
                   int64_t bytes, int64_t start_ns) const;

  const ParameterServerOptions options_;
  const int64_t window_;  // iterations in flight at once (SlotOf)
  CpuDevice* const device_;
  // Serialises the optimizer's kernels on a device of several threads,
  // whose ParallelFor runs one job at a time (common/cpu_device.h); on one
  // thread each kernel runs on its caller and chunks update concurrently.
  absl::Mutex device_mu_;

  mutable absl::Mutex mu_;
  // Null until the first registration states the signature.
  std::unique_ptr<const Layout> layout_ ABSL_GUARDED_BY(mu_);
  // Per global chunk: its version as published (Chunk::version, copied
  // under mu_ once the update is written), which waits and HasChunks read.
  std::vector<int64_t> chunk_version_ ABSL_GUARDED_BY(mu_);
  // Gradient elements held early in the chunks, this iteration.
  std::atomic<int64_t> early_elements_{0};
  // Created at the first registration, when the steps per epoch are known;
  // ApplyRange calls on different chunks run concurrently (disjoint ranges
  // of its momentum buffer; its kernel's device serialised by device_mu_).
  std::unique_ptr<SgdOptimizer> optimizer_ ABSL_GUARDED_BY(mu_);
  int64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t steps_per_epoch_ ABSL_GUARDED_BY(mu_) = -1;  // -1 until the first registration

  // Initial values given to Create: ordered (layout_ set, values in the
  // chunks) or by name until the first registration lays them out.
  std::vector<NamedTensor> named_initial_ ABSL_GUARDED_BY(mu_);
  bool initialized_ ABSL_GUARDED_BY(mu_) = false;
  InitialChunks initial_chunks_ ABSL_GUARDED_BY(mu_);  // from rank 0, when not given

  // One worker's pushes of one iteration in flight.
  struct WorkerPushes {
    // Per global chunk: claimed by a message that passed every check (its
    // sum may still be under way).
    std::vector<bool> pushed;
    // Per global chunk: pushed by a previous process of this worker, which
    // registered again since; a push of it is accepted and dropped (see
    // Register).
    std::vector<bool> carried;
    int64_t chunks = 0;        // pushed or carried
    int64_t num_samples = -1;  // -1 before the first chunk
  };
  struct WorkerState {
    std::string id;
    std::string session;  // the last registration's credential
    int64_t heard_ns = -1;
    int64_t last_push_iteration = -1;
    int64_t last_push_ns = -1;
    std::vector<WorkerPushes> slots;  // iteration k's in slots[SlotOf(k)]
  };
  std::vector<WorkerState> workers_ ABSL_GUARDED_BY(mu_);

  const SessionIssuer sessions_;  // this process's incarnation and sessions (sessions.h)
  // One per iteration in flight (iterations_[SlotOf(k)]). Per global
  // chunk: whether every member's part is summed and its update not yet
  // taken up (ready); `completed` counts the chunks every member has pushed
  // (a waived rank counting as pushed), counted before their update starts
  // (none for the iteration in progress: nothing of it is applied, the
  // state is at a boundary), `applied` those published.
  struct IterationState {
    std::vector<bool> ready;
    int64_t completed = 0;
    int64_t applied = 0;
    bool overflow = false;  // a chunk's update was skipped (loss scaling)
  };
  std::vector<IterationState> iterations_ ABSL_GUARDED_BY(mu_);  // by SlotOf
  // Dynamic loss scaling: the scale of iteration version_, the clean
  // iterations in a row before it, and the iterations skipped in all.
  LossScaleState loss_scale_ ABSL_GUARDED_BY(mu_);
  // Per global chunk: a thread is applying its updates (AdvanceChunk).
  std::vector<bool> applying_ ABSL_GUARDED_BY(mu_);
  int64_t version_ns_ ABSL_GUARDED_BY(mu_) = -1;  // when version_ was published
  // CaptureState's requests and the updates they hold back.
  CaptureRequests captures_ ABSL_GUARDED_BY(mu_);

  // Who takes part in each iteration (DropWorker, Register, Members).
  Membership membership_ ABSL_GUARDED_BY(mu_);
  // At a version boundary: the next members become the current ones, and
  // every chunk waives the ranks that take no part.
  void AdvanceMembershipLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
};

}  // namespace ps::server

#endif  // PS_SERVER_PARAMETER_SERVER_H_
