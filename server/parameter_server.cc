#include "server/parameter_server.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/push_checks.h"
#include "common/status_macros.h"
#include "server/registration_checks.h"

namespace ps::server {

ParameterServer::ParameterServer(const ParameterServerOptions& options, CpuDevice* device)
    : options_(options),
      window_(options.consistency->Window()),
      device_(device),
      events_(options.observer, options.clock),
      workers_(options.num_workers),
      updates_(events_.NowNanos()),
      membership_(options.num_workers),
      loss_scale_(LossScaleState::Initial(options.loss_scale)) {}

absl::StatusOr<std::unique_ptr<ParameterServer>> ParameterServer::Create(
    const ParameterServerOptions& options, CpuDevice* device) {
  PS_RETURN_IF_ERROR(ValidateParameterServerOptions(options));
  return std::unique_ptr<ParameterServer>(new ParameterServer(options, device));
}

absl::StatusOr<std::unique_ptr<ParameterServer>> ParameterServer::CreateFromState(
    const ParameterServerOptions& options, State state, CpuDevice* device) {
  PS_RETURN_IF_ERROR(CheckServerState(state, options.optimizer.sgd.momentum != 0,
                                      options.loss_scale.dynamic));
  std::vector<float> momentum = std::move(state.momentum);
  PS_ASSIGN_OR_RETURN(std::unique_ptr<ParameterServer> server,
                      Create(options, state.signature, std::move(state.parameters), device));
  absl::MutexLock lock(&server->mu_);
  PS_RETURN_IF_ERROR(server->CreateOptimizerLocked(state.steps_per_epoch));
  PS_RETURN_IF_ERROR(server->optimizer_->RestoreMomentum(momentum));
  server->steps_per_epoch_ = state.steps_per_epoch;
  if (options.loss_scale.dynamic && state.loss_scale != 0) {
    // Where the saved server's scale was, so that the steps after the
    // resume are skipped and scaled as they would have been.
    server->loss_scale_ = {state.loss_scale, state.loss_scale_clean_iterations,
                           state.loss_scale_skipped_iterations};
  }
  server->updates_.SetVersion(state.version);
  server->table_->SetVersion(state.version);
  return server;
}

absl::StatusOr<std::unique_ptr<ParameterServer>> ParameterServer::Create(
    const ParameterServerOptions& options, std::vector<ParamSpec> signature,
    std::vector<float> initial, CpuDevice* device) {
  PS_ASSIGN_OR_RETURN(std::vector<NamedTensor> named, NameFlatValues(signature, initial));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<ParameterServer> server,
                      CreateFromNamedTensors(options, std::move(named), device));
  if (!signature.empty()) {
    absl::MutexLock lock(&server->mu_);
    PS_RETURN_IF_ERROR(server->AdoptSignatureLocked(signature));
  }
  return server;
}

absl::StatusOr<std::unique_ptr<ParameterServer>> ParameterServer::CreateFromNamedTensors(
    const ParameterServerOptions& options, std::vector<NamedTensor> initial, CpuDevice* device) {
  PS_RETURN_IF_ERROR(CheckNamedTensors(initial));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<ParameterServer> server, Create(options, device));
  absl::MutexLock lock(&server->mu_);
  server->named_initial_ = std::move(initial);
  return server;
}

absl::Status ParameterServer::AdoptSignatureLocked(const std::vector<ParamSpec>& signature) {
  PS_ASSIGN_OR_RETURN(table_, ChunkTable::Create(signature, options_.chunk_elements,
                                                 kMaxParameters, named_initial_,
                                                 options_.num_workers, window_, device_));
  const bool given = !named_initial_.empty();
  named_initial_.clear();
  if (given) updates_.SetInitialized();
  initial_chunks_.Expect(given ? 0 : table_->layout().total_chunks);
  workers_.LayOut(table_->layout().total_chunks, window_);
  updates_.LayOut(&table_->layout(), window_);
  return absl::OkStatus();
}

absl::Status ParameterServer::CreateOptimizerLocked(int64_t steps_per_epoch) {
  OptimizerOptions optimizer = options_.optimizer;
  optimizer.schedule.steps_per_epoch = std::max<int64_t>(1, steps_per_epoch);
  PS_ASSIGN_OR_RETURN(optimizer_,
                      CreateOptimizer(optimizer, table_->layout().num_parameters, device_));
  return absl::OkStatus();
}

absl::StatusOr<ParameterServer::Registration> ParameterServer::Register(
    const std::string& worker_id, const std::vector<ParamSpec>& signature, int requested_rank,
    int64_t steps_per_epoch, const WorkerIdentity& identity) {
  absl::MutexLock lock(&mu_);
  // The model first (the most telling difference), then the data's steps
  // per epoch; the first worker's signature is adopted only once both pass.
  PS_RETURN_IF_ERROR(CheckRegistrant(worker_id, requested_rank, options_.num_workers,
                                     table_ == nullptr ? nullptr : &table_->layout().signature,
                                     signature));
  PS_RETURN_IF_ERROR(CheckStepsPerEpoch(worker_id, steps_per_epoch, steps_per_epoch_,
                                        options_.optimizer.schedule));
  if (table_ == nullptr) PS_RETURN_IF_ERROR(AdoptSignatureLocked(signature));
  PS_RETURN_IF_ERROR(workers_.CheckIdentity(worker_id, identity, events_.NowNanos()));
  PS_ASSIGN_OR_RETURN(const int rank, ChooseRank(workers_.ids(), worker_id, requested_rank));
  if (optimizer_ == nullptr) PS_RETURN_IF_ERROR(CreateOptimizerLocked(steps_per_epoch));
  // A dropped rank is back in at a step boundary.
  PS_ASSIGN_OR_RETURN(const int64_t joins_at, membership_.Join(rank, updates_.version()));
  // Every check has passed: the workers' state changes from here on.
  steps_per_epoch_ = steps_per_epoch;
  Registration reg;
  reg.session = sessions_.Issue();
  workers_.Admit(rank, worker_id, reg.session, /*carry=*/updates_.initialized(),
                 events_.NowNanos(), identity.proof);
  reg.rank = rank;
  reg.num_workers = options_.num_workers;
  reg.version = joins_at;
  reg.members = membership_.MembersAt(joins_at, updates_.version());
  reg.chunk_elements = options_.chunk_elements;
  reg.send_initial_parameters = !updates_.initialized() && rank == 0;
  // A restarted rank 0 sends everything again.
  if (reg.send_initial_parameters) initial_chunks_.Restart();
  return reg;
}

absl::Status ParameterServer::CheckSession(int rank, absl::string_view session) const {
  PS_RETURN_IF_ERROR(CheckIncarnation(session));
  absl::MutexLock lock(&mu_);
  return workers_.CheckSession(rank, session);
}

absl::Status ParameterServer::Heartbeat(int rank, absl::string_view session) {
  PS_RETURN_IF_ERROR(CheckSession(rank, session));
  absl::MutexLock lock(&mu_);
  workers_.Heard(rank, events_.NowNanos());
  return absl::OkStatus();
}

ParameterServer::Progress ParameterServer::progress() const {
  absl::MutexLock lock(&mu_);
  Progress p;
  p.version = updates_.version();
  p.initialized = updates_.initialized();
  p.version_ns = updates_.version_ns();
  p.total_chunks = table_ == nullptr ? 0 : table_->layout().total_chunks;
  p.workers = workers_.Progress(updates_.version());
  for (WorkerProgress& w : p.workers) w.dropped = membership_.sits_out(w.rank);
  return p;
}

absl::Status ParameterServer::CheckPusherLocked(int rank, int64_t num_samples) const {
  PS_RETURN_IF_ERROR(workers_.CheckHeld(rank, "push from"));
  if (!updates_.initialized()) {
    return absl::FailedPreconditionError(
        "push before the initial parameters are complete (version 0 does not exist yet)");
  }
  return CheckPushSamples(num_samples);
}

absl::Status ParameterServer::CheckPushLocked(int rank, int64_t iteration,
                                              int64_t num_samples) const {
  PS_RETURN_IF_ERROR(CheckPusherLocked(rank, num_samples));
  const int64_t version = updates_.version();
  if (absl::Status ahead = options_.consistency->CheckNotAhead(iteration, version); !ahead.ok()) {
    const std::vector<int> missing = workers_.RanksMissing(version, membership_.participating());
    return absl::Status(ahead.code(), absl::StrCat(ahead.message(), ", waiting for ranks ",
                                                   absl::StrJoin(missing, ", ")));
  }
  if (iteration < version || iteration >= version + window_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "push for iteration ", iteration, " but the server is at iteration ", version));
  }
  PS_RETURN_IF_ERROR(membership_.CheckTakesPart(rank, iteration));
  return CheckSameSamples(num_samples, workers_.num_samples(rank, iteration),
                          absl::StrCat("worker rank ", rank), iteration);
}

absl::Status ParameterServer::PushChunkBytes(int rank, int64_t iteration, int64_t num_samples,
                                             absl::Span<const ChunkBytes> chunks) {
  if (options_.consistency->AppliesEachPush()) {
    return absl::FailedPreconditionError(
        "a synchronous push to an asynchronous server (ApplyNow takes its pushes)");
  }
  const std::string what =
      absl::StrCat("pushed by worker rank ", rank, " in iteration ", iteration);
  int64_t start_ns = 0;
  ChunkTable* table = nullptr;
  std::vector<int64_t> global_chunks;
  global_chunks.reserve(chunks.size());
  absl::Status shapes;
  {  // 1. Against the bookkeeping, under mu_: everything but the values.
    absl::MutexLock lock(&mu_);
    start_ns = events_.Start();
    PS_RETURN_IF_ERROR(CheckPushLocked(rank, iteration, num_samples));
    table = table_.get();
    shapes = CheckChunkShapes(table->layout(), chunks, workers_.pushed(rank, iteration), what,
                              &global_chunks);
  }
  // 2. The values, under no lock (they are the message's own), of the
  //    chunks before any that failed step 1: errors come in chunk order.
  //    Under dynamic loss scaling a non-finite value is an overflow.
  std::vector<bool> overflow(chunks.size(), false);
  PS_RETURN_IF_ERROR(CheckChunkValues(table->layout(), chunks, global_chunks.size(),
                                      options_.loss_scale.dynamic ? &overflow : nullptr));
  PS_RETURN_IF_ERROR(shapes);
  // 3. Claim the chunks, under mu_, after checking again what a concurrent
  //    message of this worker may have changed meanwhile: of two messages
  //    with a chunk in common one is refused here, having added nothing.
  //    From here on the message is added whole.
  Optimizer* optimizer = nullptr;
  std::vector<bool> carried;  // pushed by a previous process: not summed again
  {
    absl::MutexLock lock(&mu_);
    PS_RETURN_IF_ERROR(CheckPushLocked(rank, iteration, num_samples));
    const int64_t already =
        workers_.Claim(rank, iteration, num_samples, global_chunks, events_.NowNanos(), &carried);
    if (already >= 0) return AlreadyReceivedError(table->layout(), chunks[already], what);
    // The next iteration's members are announced with the first push of
    // this one (workers read them from the replies to split its batch).
    membership_.AnnounceNext();
    optimizer = optimizer_.get();
  }
  // 4. Add each chunk to its sum, under the chunk's lock alone. A part
  //    that completes its chunk as the sum's last term is left for step 5,
  //    which reads it in place inside the update.
  struct Completed {
    int64_t gc;
    size_t index;            // in the message
    bool last_term_pending;  // this message's part is not in the sum yet
  };
  std::vector<Completed> complete;  // the chunks every member has now pushed
  for (size_t c = 0; c < chunks.size(); ++c) {
    if (carried[c]) continue;
    const ChunkTable::Added added =
        table->Add(global_chunks[c], iteration, rank, chunks[c].pieces, num_samples, overflow[c]);
    if (added.completes) complete.push_back({global_chunks[c], c, added.last_term_pending});
  }
  // Counted before any is applied: a state capture from here on waits for
  // the boundary instead of taking a half-updated model for one.
  updates_.AddComplete(iteration, static_cast<int64_t>(complete.size()));
  if (options_.observer != nullptr) {
    int64_t bytes = 0;
    for (const ChunkBytes& chunk : chunks) bytes += PiecesBytes(chunk.pieces);
    events_.ReportSince(EventKind::kServerPush, ServerPushLane(rank), iteration,
                        chunks.empty() ? absl::string_view() : table->name(global_chunks[0]),
                        bytes, start_ns);
  }
  // 5. Apply and publish each chunk this message completed, in message
  //    order (under ssp:S once the chunk's earlier iterations are applied:
  //    then with them). A pending last term goes into the update itself
  //    when it may run now; otherwise (an earlier iteration of the chunk
  //    still to apply, or a capture holding updates back) it is added to
  //    the sum and the chunk takes the usual path.
  for (const Completed& done : complete) {
    if (done.last_term_pending) {
      const LastTerm last{iteration, chunks[done.index].pieces};
      bool applied = false;
      PS_RETURN_IF_ERROR(AdvanceChunk(*table, *optimizer, done.gc, &last, &applied));
      if (applied) continue;
      table->AddLastTerm(done.gc, iteration, rank, last.pieces);
    }
    updates_.MarkReady(iteration, done.gc);  // the tracker's lock: claims take it under mu_
    PS_RETURN_IF_ERROR(AdvanceChunk(*table, *optimizer, done.gc, nullptr, nullptr));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ParameterServer::ApplyNow(int rank, int64_t based_on_version,
                                                  int64_t num_samples,
                                                  absl::Span<const ChunkBytes> chunks) {
  if (!options_.consistency->AppliesEachPush()) {
    return absl::FailedPreconditionError("an asynchronous push to a synchronous server");
  }
  ChunkTable* table = nullptr;
  Optimizer* optimizer = nullptr;
  std::vector<int64_t> global_chunks;
  absl::Status shapes;
  {
    absl::MutexLock lock(&mu_);
    PS_RETURN_IF_ERROR(CheckPusherLocked(rank, num_samples));
    if (based_on_version < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "push claims it was computed from version ", based_on_version, "; versions start at 0"));
    }
    table = table_.get();
    optimizer = optimizer_.get();
    // No chunk is "already pushed" in this mode: every push is an update.
    shapes = CheckChunkShapes(table->layout(), chunks, /*received=*/{},
                              absl::StrCat("pushed by worker rank ", rank), &global_chunks);
    if (shapes.ok()) workers_.NotePush(rank, events_.NowNanos());
  }
  PS_RETURN_IF_ERROR(CheckChunkValues(table->layout(), chunks, global_chunks.size()));
  PS_RETURN_IF_ERROR(shapes);
  int64_t staleness = 0;
  for (size_t c = 0; c < chunks.size(); ++c) {
    const int64_t gc = global_chunks[c];
    const int64_t start_ns = events_.Start();
    PS_ASSIGN_OR_RETURN(const ChunkTable::Applied applied,
                        table->ApplyNow(gc, based_on_version, num_samples, options_.num_workers,
                                        chunks[c].pieces, *optimizer));
    staleness = std::max(staleness, applied.staleness);
    // The event first, so that once the version is visible its event is in;
    // the tracker publishes under its own lock.
    events_.ReportSince(EventKind::kServerUpdate, kServerUpdateLane, applied.version - 1,
                        table->name(gc), table->layout().chunk_length[gc] * sizeof(float),
                        start_ns);
    updates_.PublishAsync(gc, applied.version, events_.NowNanos());
  }
  return staleness;
}

absl::Status ParameterServer::InitializeChunkBytes(int rank, absl::Span<const ChunkBytes> chunks) {
  // Once per job, and before anyone may push or pull: all of it under mu_.
  absl::MutexLock lock(&mu_);
  PS_RETURN_IF_ERROR(workers_.CheckHeld(rank, "initial parameters from"));
  PS_ASSIGN_OR_RETURN(const std::vector<int64_t> global_chunks,
                      initial_chunks_.Check(rank, table_->layout(), chunks));
  for (size_t c = 0; c < chunks.size(); ++c) {
    table_->Initialize(global_chunks[c], chunks[c].pieces);
    if (initial_chunks_.Receive(global_chunks[c])) updates_.SetInitialized();
  }
  return absl::OkStatus();
}

absl::Status ParameterServer::AdvanceChunk(ChunkTable& table, Optimizer& optimizer,
                                           int64_t gc, const LastTerm* last,
                                           bool* applied_last) {
  for (;;) {
    // 1. Claim the chunk's next update, if it is ready and allowed: its
    //    iteration is the chunk's version. An iteration whose last term
    //    the caller holds is never marked ready (no other thread may apply
    //    it without that term): it is claimed here, or left to the caller.
    int64_t iteration = 0;
    float loss_scale = 0;
    {
      absl::MutexLock lock(&mu_);
      if (updates_.applying(gc)) return absl::OkStatus();  // its applier goes on
      loss_scale = loss_scale_.scale;  // the iteration's: loss scaling is sync only
      iteration = updates_.chunk_version(gc);
      if (last != nullptr) {
        if (iteration != last->iteration || captures_.HoldsBack(iteration)) return absl::OkStatus();
        *applied_last = true;
      } else {
        if (!updates_.ready(iteration, gc)) return absl::OkStatus();
        if (captures_.HoldsBack(iteration)) {
          captures_.NoteHeldBack();  // applied once the capture is served
          return absl::OkStatus();
        }
      }
      updates_.StartApplying(iteration, gc);
    }
    // 2. The update, under the chunk's lock alone.
    const int64_t start_ns = events_.Start();
    const absl::StatusOr<bool> skipped = table.Apply(
        gc, iteration, loss_scale, last != nullptr ? &last->pieces : nullptr, optimizer);
    last = nullptr;  // the later iterations (ssp) come summed
    // 3. Publish it; the event is reported under mu_ too, so that once a
    //    version is visible every update event of it is in.
    std::vector<std::function<void(State)>> captures;
    State state;
    bool resume = false;
    {
      absl::MutexLock lock(&mu_);
      if (!skipped.ok()) {
        updates_.StopApplying(gc);
        return skipped.status();
      }
      events_.ReportSince(EventKind::kServerUpdate, kServerUpdateLane, iteration, table.name(gc),
                          table.layout().chunk_length[gc] * sizeof(float), start_ns);
      bool iteration_skipped = false;
      if (updates_.Publish(iteration, gc, *skipped, events_.NowNanos(), &iteration_skipped)) {
        // The iteration's last chunk (each chunk's iterations are applied
        // in order): every member's pushes are in.
        FinishIterationLocked(iteration, iteration_skipped, &captures, &state, &resume);
      }
    }
    for (auto& done : captures) done(state);
    if (resume) PS_RETURN_IF_ERROR(ReleaseHeldBack(table, optimizer, gc));
  }
}

absl::Status ParameterServer::ReleaseHeldBack(ChunkTable& table, Optimizer& optimizer,
                                              int64_t except_gc) {
  // The caller goes on with `except_gc` itself.
  absl::Status released;
  for (int64_t gc = 0; gc < table.layout().total_chunks && released.ok(); ++gc) {
    if (gc != except_gc) released = AdvanceChunk(table, optimizer, gc, nullptr, nullptr);
  }
  if (!released.ok()) return released;
  absl::MutexLock lock(&mu_);
  captures_.CountRelease();
  return absl::OkStatus();
}

void ParameterServer::FinishIterationLocked(int64_t iteration, bool skipped,
                                            std::vector<std::function<void(State)>>* captures,
                                            State* state, bool* resume) {
  loss_scale_.Advance(skipped, options_.loss_scale.growth_interval);
  workers_.EndIteration(iteration);
  // The new members' waivers, before any push of the new iteration can be
  // claimed (it needed this version).
  if (membership_.AdvanceIteration()) table_->WaiveAbsent(membership_.participating());
  // The boundary a capture waits for: every chunk at version_, none ahead
  // (the updates past it are held back), nothing moves while it is copied.
  CaptureRequests::Release release = captures_.AtBoundary(updates_.version());
  if (!release.captures.empty()) {
    *state = CaptureServerState(*table_, optimizer_.get(), options_.optimizer, updates_.version(),
                                steps_per_epoch_, loss_scale_);
    *captures = std::move(release.captures);
  }
  *resume = release.resume;
}

void ParameterServer::CaptureState(std::function<void(State)> done, int64_t at_version) {
  std::vector<std::function<void(State)>> captures;
  State state;
  {
    absl::MutexLock lock(&mu_);
    captures_.Add(std::move(done));
    // A boundary ahead that no chunk can have passed yet: held for.
    if (updates_.initialized() && at_version > updates_.version() &&
        at_version >= updates_.ReachableVersion()) {
      captures_.HoldBackFrom(at_version);
      return;
    }
    // At a boundary now (version 0 exists, no chunk of the iteration in
    // progress complete, so none is ahead of it): served here. Otherwise by
    // the push that completes the iteration at which no chunk is ahead,
    // the updates past it held back until then; or, before version 0, once
    // version 1 exists.
    if (!updates_.initialized() || updates_.complete(updates_.version()) > 0) {
      captures_.HoldBackFrom(updates_.ReachableVersion());
      return;
    }
    state = CaptureServerState(*table_, optimizer_.get(), options_.optimizer, updates_.version(),
                               steps_per_epoch_, loss_scale_);
    captures = captures_.TakeAll();
  }
  for (auto& capture : captures) capture(state);
}

int ParameterServer::CancelCaptures() {
  ChunkTable* table = nullptr;
  Optimizer* optimizer = nullptr;
  int n = 0;
  {
    absl::MutexLock lock(&mu_);
    if (!captures_.Cancel(&n).resume) return n;
    table = table_.get();
    optimizer = optimizer_.get();
  }
  // An error is an optimizer invariant, which the pushes report too.
  ReleaseHeldBack(*table, *optimizer, /*except_gc=*/-1).IgnoreError();
  return n;
}

int64_t ParameterServer::held_back_releases() const {
  absl::MutexLock lock(&mu_);
  return captures_.releases();
}

absl::StatusOr<std::vector<ParameterServer::ChunkId>> ParameterServer::DropWorker(int rank) {
  std::vector<int64_t> to_waive;
  int64_t iteration = 0;
  ChunkTable* table = nullptr;
  Optimizer* optimizer = nullptr;
  {
    absl::MutexLock lock(&mu_);
    PS_RETURN_IF_ERROR(workers_.CheckHeld(rank, "cannot drop"));
    if (absl::Status can = options_.consistency->CheckCanShrink(); !can.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot drop rank ", rank, " under ", options_.consistency->Name(), ": ", can.message()));
    }
    PS_ASSIGN_OR_RETURN(const bool took_part, membership_.Drop(rank));
    iteration = updates_.version();
    table = table_.get();
    optimizer = optimizer_.get();
    if (table == nullptr || !took_part) return std::vector<ChunkId>();
    to_waive = workers_.Unpushed(rank, iteration);
  }
  // Waive its parts not pushed: chunks that now have every other part are
  // complete (none of them can have been: they lacked this rank's).
  const std::vector<int64_t> complete = table->WaiveEach(to_waive, iteration, rank);
  // Counted before any is applied, as a push's completions are.
  updates_.AddComplete(iteration, static_cast<int64_t>(complete.size()));
  std::vector<ChunkId> ids;
  for (const int64_t gc : complete) {
    ids.push_back(table->layout().IdOf(gc));
    updates_.MarkReady(iteration, gc);
    PS_RETURN_IF_ERROR(AdvanceChunk(*table, *optimizer, gc, nullptr, nullptr));
  }
  return ids;
}

absl::StatusOr<std::vector<int>> ParameterServer::Members(int64_t iteration) const {
  absl::MutexLock lock(&mu_);
  return membership_.MembersOf(iteration, updates_.version(), window_);
}

absl::StatusOr<ParameterServer::ChunkViews> ParameterServer::PullChunkViews(
    int64_t version, absl::Time deadline, absl::Span<const ChunkId> chunks, bool exact,
    bool with_previous) {
  PS_ASSIGN_OR_RETURN(const std::vector<int64_t> global_chunks,
                      updates_.Await(version, deadline, chunks));
  ChunkTable* table = nullptr;
  {
    absl::MutexLock lock(&mu_);
    table = table_.get();
  }
  const int64_t start_ns = events_.Start();
  PS_ASSIGN_OR_RETURN(ChunkViews views,
                      table->TakeAll(global_chunks, version, exact, with_previous));
  if (chunks.empty()) views.version = updates_.version();  // the server's
  events_.ReportSince(EventKind::kServerPull, kServerPullLane, views.version,
                      chunks.empty() ? absl::string_view() : table->name(global_chunks[0]),
                      views.bytes, start_ns);
  return views;
}

absl::StatusOr<int64_t> ParameterServer::WaitForVersion(int64_t version, absl::Time deadline) {
  PS_RETURN_IF_ERROR(updates_.Await(version, deadline, {}).status());
  return updates_.version();
}

std::vector<ParamSpec> ParameterServer::signature() const {
  absl::MutexLock lock(&mu_);
  return table_ == nullptr ? std::vector<ParamSpec>() : table_->layout().signature;
}

ParameterServer::LossScale ParameterServer::loss_scale() const {
  absl::MutexLock lock(&mu_);
  return {updates_.version(), loss_scale_.scale, loss_scale_.skipped_iterations};
}

int64_t ParameterServer::steps_per_epoch() const {
  absl::MutexLock lock(&mu_);
  return steps_per_epoch_;
}

int64_t ParameterServer::held_elements() const {
  absl::MutexLock lock(&mu_);
  return table_ == nullptr ? 0 : table_->held_elements();
}

int64_t ParameterServer::num_parameters() const {
  absl::MutexLock lock(&mu_);
  return table_ == nullptr ? 0 : table_->layout().num_parameters;
}

int64_t ParameterServer::ChunkLength(int key, int64_t chunk) const {
  absl::MutexLock lock(&mu_);
  const int64_t gc = table_ == nullptr ? -1 : table_->layout().GlobalChunk(key, chunk);
  return gc < 0 ? -1 : table_->layout().chunk_length[gc];
}

}  // namespace ps::server
