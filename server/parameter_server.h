#ifndef PS_SERVER_PARAMETER_SERVER_H_
#define PS_SERVER_PARAMETER_SERVER_H_

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
#include "common/cpu_device.h"
#include "common/optimizer/optimizer.h"
#include "common/param_spec.h"
#include "common/timed_event.h"
#include "server/chunk_message.h"
#include "server/chunk_table.h"
#include "server/initial_values.h"
#include "server/job_progress.h"
#include "server/membership.h"
#include "server/parameter_server_options.h"
#include "server/sessions.h"
#include "server/state_capture.h"
#include "server/update_tracker.h"
#include "server/worker_ledger.h"

namespace ps::server {

// The parameter server's state machine, free of any transport: the gRPC
// service (and tests) translate calls into these methods. It coordinates
// components that each hold one part of the state under its own contract:
// ChunkTable (parameters, versions, rank-order sums: bit-identical in any
// arrival order), WorkerLedger (ranks, sessions, liveness, pushes),
// UpdateTracker (ready, applying and published updates), Membership (who
// takes part in each iteration), CaptureRequests (checkpoint captures and
// the updates they hold back), the Consistency policy, the optimizer and
// the loss scale (common/optimizer/), and the push checks (chunk_message.h).
// As soon as every member has pushed chunk c of an iteration, that chunk is
// updated (scaled by the samples of all the pushes) and published, so
// workers pull the first layers back while the last are still pushed; the
// result is bit for bit one update of the whole vector.
//
// Versions: version v is the parameters after v updates; iteration v is
// the step computed from version v, whose pushes produce version v + 1;
// each chunk has its own version, v + 1 once iteration v has updated it.
// Under the optimizer "none" (sum-only) version v + 1 is iteration v's mean
// gradient, version 0 the initial parameters, and a capture holds the
// newest version's values without momentum. The server knows no model: the
// first registration's signature is the job's, and the initial values come
// from Create (a checkpoint, or tensors by name) or from rank 0.
//
// Every method is thread-safe; bad input never changes state.
//
// Locks: mu_ (bookkeeping) over the short work (registration, claims,
// version 0's assembly, publishing), each chunk's own lock (ChunkTable) over
// the heavy work (sums, the optimizer step, copies), and UpdateTracker's,
// on which pulls wait without holding up pushes. A push (1) checks its
// message under mu_ without reading its values, (2) checks the values under
// no lock, (3) claims its chunks under mu_ after checking again what a
// concurrent message of the same worker may have changed, (4) sums each
// chunk under the chunk's lock and (5) applies each chunk it completed
// under the chunk's lock, publishing it under mu_: pushes of different
// chunks run at once. The tracker's and a chunk's lock may be taken while
// holding mu_, never the reverse, and neither while holding the other.
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
  // A server that starts from tensors matched by name to the first
  // worker's signature (shapes must agree; tensors it does not name, such
  // as batch-norm buffers, are ignored). kInvalidArgument for a non-finite
  // value or a size that does not match its shape.
  static absl::StatusOr<std::unique_ptr<ParameterServer>> CreateFromNamedTensors(
      const ParameterServerOptions& options, std::vector<NamedTensor> initial,
      CpuDevice* device);

  // The server's whole state at a version boundary (state_capture.h).
  using State = ServerState;
  // A server resumed from `state` (a checkpoint): version `state.version`
  // exists at once, with the schedule, momentum and loss scale restored, so
  // the next updates are bit for bit the saved server's. Workers must state
  // the same signature and steps per epoch. kInvalidArgument as
  // CheckServerState says.
  static absl::StatusOr<std::unique_ptr<ParameterServer>> CreateFromState(
      const ParameterServerOptions& options, State state, CpuDevice* device);

  // Calls `done` once with the state at the first version boundary from
  // now: at once when nothing of the iteration in progress is applied, else
  // on the thread of the push that completes it, before the new version is
  // published (under ssp:S the later iterations' updates wait meanwhile;
  // their pushes are still summed). Before version 0 it waits for version
  // 1. `done` must not call back into the server. Requests made before one
  // is served are served together.
  // With `at_version`: at that boundary exactly while no chunk can have
  // passed it (the updates of iteration `at_version` wait for it).
  void CaptureState(std::function<void(State)> done, int64_t at_version = -1);
  // How many times the updates a capture held back were applied together:
  // each may publish chunks no call of their own sent, so a caller
  // answering waiting pulls by the chunks a call sent looks at them all.
  int64_t held_back_releases() const;
  // Drops the requests not yet served (`done` never called); how many.
  int CancelCaptures();

  struct Registration {
    int rank = 0;
    int num_workers = 1;
    int64_t version = 0;
    int64_t chunk_elements = 0;
    // Rank 0 of a server without initial values: it must send them
    // (InitializeChunkBytes) before anyone can pull version 0.
    bool send_initial_parameters = false;
    // The credential for acting as `rank` (CheckSession): this server's
    // incarnation and a random secret, new at every registration.
    std::string session;
    std::vector<int> members;  // the ranks in iteration `version` (Members)
  };
  // Registers worker `worker_id` with its model's signature, as
  // `requested_rank` if >= 0, else the lowest free rank; the same id again
  // gets its rank back (a restarted worker) and resumes at the iteration in
  // progress (the version returned; pull it exactly), what its previous
  // process pushed of it counting once (pushed again, it is dropped), and
  // the previous process's session stops working. `steps_per_epoch` (0:
  // not stated) must be the same for all workers (an epoch schedule needs
  // it). Errors: kFailedPrecondition for a different signature (naming the
  // first difference), named initial tensors that lack a parameter or
  // disagree on a shape, or steps_per_epoch that differs or is missing for
  // an epoch schedule; kResourceExhausted when num_workers others are
  // registered or the model cannot fit in memory; kAlreadyExists for
  // another worker's rank, or a live id (heard within
  // identity.liveness_timeout) that `identity` does not prove
  // (WorkerLedger::CheckIdentity); kUnavailable for a dropped rank whose next
  // iteration is announced without it (try again); kInvalidArgument for an
  // empty id, a rank out of range or an empty or non-F32 signature.
  absl::StatusOr<Registration> Register(const std::string& worker_id,
                                        const std::vector<ParamSpec>& signature,
                                        int requested_rank = -1, int64_t steps_per_epoch = 0,
                                        const WorkerIdentity& identity = {});

  // Whether `session` is the last registration's credential for `rank`:
  // kAborted for another incarnation's (this server restarted: register
  // again) or an empty one, kPermissionDenied for this incarnation's but
  // not `rank`'s, kNotFound for a rank nobody holds.
  absl::Status CheckSession(int rank, absl::string_view session) const;
  // CheckSession's first check alone (calls that act as no rank).
  absl::Status CheckIncarnation(absl::string_view session) const {
    return sessions_.CheckIncarnation(session);
  }
  // This process's random identity, the prefix of its sessions.
  const std::string& incarnation() const { return sessions_.incarnation(); }
  // A sign of life from `rank` (session checked as in CheckSession).
  absl::Status Heartbeat(int rank, absl::string_view session);

  // Where the job stands, for stall reports and liveness (job_progress.h).
  using WorkerProgress = server::WorkerProgress;
  using Progress = JobProgress;
  Progress progress() const;

  // A signature's elements stay below this (4 TiB of fp32; kInvalidArgument
  // at registration), so sizes derived from it cannot overflow.
  static constexpr int64_t kMaxParameters = int64_t{1} << 40;

  using ChunkBytes = server::ChunkBytes;
  // Adds worker `rank`'s gradient chunks of `iteration` over `num_samples`
  // samples (the same for all its chunks of the iteration; 0 for an empty
  // shard), all or nothing. Errors, each leaving all state untouched:
  // kNotFound unknown rank; kOutOfRange key or chunk out of range;
  // kInvalidArgument a byte count not 4 x the chunk's length, a non-finite
  // value (named) or samples out of range; kFailedPrecondition before
  // version 0, an iteration not in flight (past; or the server is
  // asynchronous), or num_samples unlike this worker's earlier chunks of
  // it; kOutOfRange under ssp:S for an iteration beyond version() + S
  // (naming the bound and the ranks awaited); kAborted for a rank dropped
  // from the iteration (register again); kAlreadyExists a chunk already
  // pushed this iteration, or twice in the message. Reads the pieces during
  // the call.
  absl::Status PushChunkBytes(int rank, int64_t iteration, int64_t num_samples,
                              absl::Span<const ChunkBytes> chunks);
  // Asynchronous consistency only (kFailedPrecondition otherwise): applies
  // `rank`'s chunks at once, each an update scaled by `num_samples` (0:
  // nothing applied), in message order; the schedule counts a chunk's
  // updates divided by the workers. Returns the push's staleness: the most
  // updates any of its chunks received since `based_on_version`
  // (kInvalidArgument when negative). Checks as PushChunkBytes (a chunk may
  // come again: every push is an update).
  absl::StatusOr<int64_t> ApplyNow(int rank, int64_t based_on_version, int64_t num_samples,
                                   absl::Span<const ChunkBytes> chunks);
  // Chunks of the initial values from the worker Register asked for them,
  // all or nothing per call; version 0 is published with the last chunk.
  // Errors, each leaving all state untouched: kNotFound unknown rank,
  // kFailedPrecondition when this worker was not asked (or they are
  // complete), kOutOfRange / kInvalidArgument / kAlreadyExists per chunk as
  // in PushChunkBytes.
  absl::Status InitializeChunkBytes(int rank, absl::Span<const ChunkBytes> chunks);

  // Waits until every requested chunk has chunk version >= `version`
  // (kDeadlineExceeded after `deadline`, naming what is missing) and returns
  // views of their current parameters, copying nothing, at the least of
  // their versions (a chunk may be one newer). An empty request waits for
  // the server's version and returns it. Before version 0 every request
  // waits for it. kOutOfRange for a chunk that does not exist, at once
  // (after the wait for version 0). The views hold their chunks as
  // ChunkTable::TakeAll says (an update of a viewed chunk meanwhile writes a
  // copy). `exact`: every chunk exactly at `version`, even one already
  // updated (kFailedPrecondition, after the wait, for one more than one
  // update ahead): what a worker rejoining mid-iteration needs.
  // `with_previous`: also each chunk's parameters of version - 1 where it is
  // at `version`, so a pull can send only what changed. Reports kServerPull.
  using ChunkId = server::ChunkId;
  using ChunkViews = ChunkTable::Views;
  absl::StatusOr<ChunkViews> PullChunkViews(int64_t version, absl::Time deadline,
                                            absl::Span<const ChunkId> chunks,
                                            bool exact = false, bool with_previous = false);
  // Whether PullChunkViews(version, ..., chunks) would answer at once (the
  // chunks have the version, or one does not exist).
  bool HasChunks(int64_t version, absl::Span<const ChunkId> chunks) const {
    return updates_.Has(version, chunks);
  }
  bool HasVersion(int64_t version) const { return updates_.Has(version, {}); }
  // Waits until the server's version is at least `version` (every chunk
  // applied that often; kDeadlineExceeded after `deadline`); returns it.
  absl::StatusOr<int64_t> WaitForVersion(int64_t version, absl::Time deadline);

  // Shrinking the job (--on_worker_loss=shrink): takes `rank` out. The
  // iteration in progress goes on without its parts not pushed (each such
  // chunk updated by the gradients that did arrive, scaled by their
  // samples), and so does the next if announced with the rank; from the
  // first iteration announced after this it is no member, and its pushes
  // are refused (kAborted). Registering again as this rank joins at the
  // first iteration not yet announced. Returns the chunks the drop
  // completed (their waiting pulls can be answered). kNotFound for a rank
  // nobody holds; kFailedPrecondition for the last member, and under a
  // policy that cannot shrink (async, ssp:S with S > 0).
  absl::StatusOr<std::vector<ChunkId>> DropWorker(int rank);
  // The ranks taking part in iteration `iteration`, ascending: a worker's
  // part of the global batch is its index among them. Known for the
  // current iteration and, once announced (a member pushed part of the
  // current one, or a dropped worker rejoined), the next. kUnavailable for
  // an iteration not announced yet, kOutOfRange for a past one.
  absl::StatusOr<std::vector<int>> Members(int64_t iteration) const;

  std::vector<ParamSpec> signature() const;  // empty until known
  int64_t version() const { return updates_.version(); }
  // Dynamic loss scaling: the scale workers multiply the loss by for
  // iteration `version` (0 without dynamic loss scaling), and the
  // iterations skipped for an overflow so far.
  struct LossScale {
    int64_t version = 0;
    float scale = 0;
    int64_t skipped_iterations = 0;
  };
  LossScale loss_scale() const;
  int64_t steps_per_epoch() const;  // -1 before the first registration
  bool initialized() const { return updates_.initialized(); }  // version 0 exists
  // Gradient elements held for their rank's turn in the sum, this iteration.
  int64_t held_elements() const;
  int64_t num_parameters() const;
  // Elements in chunk `chunk` of key `key`; -1 when either is out of range.
  int64_t ChunkLength(int key, int64_t chunk) const;
  const ParameterServerOptions& options() const { return options_; }

 private:
  ParameterServer(const ParameterServerOptions& options, CpuDevice* device);

  // Lays the chunks out for the job's `signature` (with Create's values, if
  // any); state is unchanged on error. Then the optimizer, its schedule
  // counting epochs of `steps_per_epoch`.
  absl::Status AdoptSignatureLocked(const std::vector<ParamSpec>& signature)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CreateOptimizerLocked(int64_t steps_per_epoch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A push's checks that need no chunk (PushChunkBytes): of the pusher and
  // its samples, then of the iteration.
  absl::Status CheckPusherLocked(int rank, int64_t num_samples) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckPushLocked(int rank, int64_t iteration, int64_t num_samples) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies chunk `gc`'s ready iterations (UpdateTracker::MarkReady) in
  // order, as far as the captures allow: each claimed under mu_ (one thread
  // at a time applies a chunk), updated under the chunk's lock, published
  // under mu_; the last chunk of an iteration finishes it. With `last` (the
  // last term of its iteration's sum, not added) that update reads it in
  // place if it may run now, setting *applied_last; otherwise the caller
  // adds it and marks the chunk ready as usual.
  struct LastTerm {
    int64_t iteration;
    F32Pieces pieces;
  };
  absl::Status AdvanceChunk(ChunkTable& table, Optimizer& optimizer, int64_t gc,
                            const LastTerm* last, bool* applied_last) ABSL_LOCKS_EXCLUDED(mu_);
  // Applies what the captures held back, once served or cancelled.
  absl::Status ReleaseHeldBack(ChunkTable& table, Optimizer& optimizer, int64_t except_gc)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The end of iteration `iteration`: the loss scale decides, the pushes
  // reset, the version and the membership advance; at a capture's boundary
  // the captures go to *captures with *state (run outside mu_), and
  // *resume says whether updates were held back.
  void FinishIterationLocked(int64_t iteration, bool skipped,
                             std::vector<std::function<void(State)>>* captures, State* state,
                             bool* resume) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ParameterServerOptions options_;
  const int64_t window_;  // iterations in flight: the policy's Window()
  CpuDevice* const device_;
  const SessionIssuer sessions_;
  const EventTimer events_;  // options_.observer on options_.clock

  mutable absl::Mutex mu_;
  // Null until the first registration states the signature; then it never
  // changes, so a call that read it under mu_ uses it without (the table
  // locks its chunks itself).
  std::unique_ptr<ChunkTable> table_ ABSL_GUARDED_BY(mu_);
  // Created at the first registration, once the steps per epoch are known.
  std::unique_ptr<Optimizer> optimizer_ ABSL_GUARDED_BY(mu_);
  int64_t steps_per_epoch_ ABSL_GUARDED_BY(mu_) = -1;
  // Create's values by name until the first registration lays them out;
  // then the chunks rank 0 sent, when none were given.
  std::vector<NamedTensor> named_initial_ ABSL_GUARDED_BY(mu_);
  InitialChunks initial_chunks_ ABSL_GUARDED_BY(mu_);
  WorkerLedger workers_ ABSL_GUARDED_BY(mu_);
  // Its own lock: pulls wait on it alone; claims and the end of an
  // iteration read and change it under mu_ too, to see one state.
  UpdateTracker updates_;
  Membership membership_ ABSL_GUARDED_BY(mu_);
  CaptureRequests captures_ ABSL_GUARDED_BY(mu_);
  LossScaleState loss_scale_ ABSL_GUARDED_BY(mu_);  // the scale of the current iteration
};

}  // namespace ps::server

#endif  // PS_SERVER_PARAMETER_SERVER_H_
