#include "server/parameter_server.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/f32_pieces.h"
#include "common/push_checks.h"
#include "common/status_macros.h"
#include "server/registration_checks.h"

namespace ps::server {
namespace {

// One piece per chunk, over the chunk's floats: the Span forms of the calls
// become the byte forms. `pieces` must outlive the returned chunks.
std::vector<ParameterServer::ChunkBytes> AsChunkBytes(
    absl::Span<const ParameterServer::ChunkData> chunks, std::vector<absl::string_view>* pieces) {
  pieces->clear();
  for (const ParameterServer::ChunkData& chunk : chunks) {
    pieces->emplace_back(reinterpret_cast<const char*>(chunk.data.data()),
                         chunk.data.size() * sizeof(float));
  }
  std::vector<ParameterServer::ChunkBytes> out;
  for (size_t c = 0; c < chunks.size(); ++c) {
    out.push_back({chunks[c].key, chunks[c].chunk, absl::MakeConstSpan(&(*pieces)[c], 1)});
  }
  return out;
}

}  // namespace

ParameterServer::ParameterServer(const ParameterServerOptions& options, CpuDevice* device)
    : options_(options),
      window_(options.consistency->Window()),
      device_(device),
      workers_(options.num_workers),
      membership_(options.num_workers) {
  absl::MutexLock lock(&mu_);
  version_ns_ = NowNanos();
  loss_scale_ = LossScaleState::Initial(options.loss_scale);
}

void ParameterServer::AdvanceMembershipLocked() {
  // The chunks' waivers follow the participating ranks; no push of the new
  // iteration can have been claimed (it needed this version): every
  // chunk's waivers are set before any.
  if (!membership_.AdvanceIteration() || layout_ == nullptr) return;
  const std::vector<bool>& participating = membership_.participating();
  int waived = 0;
  for (bool p : participating) waived += !p;
  for (int64_t gc = 0; gc < layout_->total_chunks; ++gc) {
    Chunk& chunk = layout_->chunks[gc];
    absl::MutexLock chunk_lock(&chunk.mu);
    for (size_t r = 0; r < participating.size(); ++r) chunk.waived[r] = !participating[r];
    chunk.waived_count = waived;
  }
}

absl::StatusOr<std::vector<int>> ParameterServer::Members(int64_t iteration) const {
  absl::MutexLock lock(&mu_);
  return membership_.MembersOf(iteration, version_, window_);
}

absl::StatusOr<std::vector<ParameterServer::ChunkId>> ParameterServer::DropWorker(int rank) {
  std::vector<int64_t> to_waive;
  int64_t iteration = 0;
  const Layout* layout = nullptr;
  SgdOptimizer* optimizer = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (!RankHeldLocked(rank)) {
      return absl::NotFoundError(absl::StrCat("no worker holds rank ", rank));
    }
    if (absl::Status can = options_.consistency->CheckCanShrink(); !can.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot drop rank ", rank, " under ", options_.consistency->Name(), ": ", can.message()));
    }
    PS_ASSIGN_OR_RETURN(const bool took_part, membership_.Drop(rank));
    iteration = version_;
    layout = layout_.get();
    optimizer = optimizer_.get();
    if (layout == nullptr || !took_part) return std::vector<ChunkId>();
    const WorkerPushes& pushes = workers_[rank].slots[SlotOf(version_)];
    for (int64_t gc = 0; gc < layout->total_chunks; ++gc) {
      if (!pushes.pushed[gc] && !pushes.carried[gc]) to_waive.push_back(gc);
    }
  }
  // Waive its parts not pushed: chunks that now have every other part are
  // complete (none of them can have been: they lacked this rank's).
  const int num_workers = options_.num_workers;
  std::vector<int64_t> complete;
  for (const int64_t gc : to_waive) {
    Chunk& chunk = layout->chunks[gc];
    absl::MutexLock lock(&chunk.mu);
    if (chunk.version != iteration || chunk.waived[rank]) continue;
    chunk.waived[rank] = true;
    ++chunk.waived_count;
    Aggregation& agg = chunk.slots[SlotOf(iteration)];
    early_elements_ -= agg.sum.SumHeldInTurn(chunk.waived);
    if (agg.pushes + chunk.waived_count == num_workers) complete.push_back(gc);
  }
  std::vector<ChunkId> ids;
  {
    // Counted before any is applied, as a push's completions are (so a
    // state capture does not take the iteration for untouched).
    absl::MutexLock lock(&mu_);
    iterations_[SlotOf(iteration)].completed += static_cast<int64_t>(complete.size());
    for (const int64_t gc : complete) {
      const int key = layout->chunk_key[gc];
      ids.push_back({key, gc - layout->key_first_chunk[key]});
    }
  }
  for (const int64_t gc : complete) {
    PS_RETURN_IF_ERROR(CompleteChunk(*layout, optimizer, iteration, gc));
  }
  return ids;
}

int64_t ParameterServer::NowNanos() const {
  return options_.clock != nullptr ? options_.clock->NowNanos() : -1;
}

absl::Status ParameterServer::Heartbeat(int rank, absl::string_view session) {
  PS_RETURN_IF_ERROR(CheckSession(rank, session));
  absl::MutexLock lock(&mu_);
  workers_[rank].heard_ns = NowNanos();
  return absl::OkStatus();
}

ParameterServer::Progress ParameterServer::progress() const {
  absl::MutexLock lock(&mu_);
  Progress p;
  p.version = version_;
  p.initialized = initialized_;
  p.version_ns = version_ns_;
  p.total_chunks = layout_ == nullptr ? 0 : layout_->total_chunks;
  for (int r = 0; r < static_cast<int>(workers_.size()); ++r) {
    const WorkerState& w = workers_[r];
    WorkerProgress wp;
    wp.rank = r;
    wp.id = w.id;
    wp.heard_ns = w.heard_ns;
    wp.last_push_iteration = w.last_push_iteration;
    wp.last_push_ns = w.last_push_ns;
    wp.dropped = membership_.dropped(r) || !membership_.participating()[r];
    wp.next_iteration = version_;
    if (!w.slots.empty()) {
      wp.pushed_chunks = w.slots[SlotOf(version_)].chunks;
      while (wp.next_iteration < version_ + window_ &&
             w.slots[SlotOf(wp.next_iteration)].chunks >= p.total_chunks) {
        ++wp.next_iteration;
      }
    }
    p.workers.push_back(std::move(wp));
  }
  return p;
}

absl::StatusOr<std::unique_ptr<ParameterServer>> ParameterServer::Create(
    const ParameterServerOptions& options, CpuDevice* device) {
  if (options.num_workers < 1 || options.num_workers > kMaxWorkers) {
    return absl::InvalidArgumentError(absl::StrCat("num_workers must be 1 to ", kMaxWorkers,
                                                   ", got ", options.num_workers));
  }
  if (options.chunk_elements < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_elements must be >= 1, got ", options.chunk_elements));
  }
  if (options.observer != nullptr && options.clock == nullptr) {
    return absl::InvalidArgumentError("an event observer needs a clock");
  }
  if (options.consistency == nullptr) {
    return absl::InvalidArgumentError("no consistency policy (server/consistency/consistency.h)");
  }
  PS_RETURN_IF_ERROR(ValidateOptimizerOptions(options.optimizer));
  PS_RETURN_IF_ERROR(ValidateLossScaleOptions(options.loss_scale));
  if (options.loss_scale.dynamic && !options.consistency->SupportsLossScaling()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dynamic loss scaling needs sync consistency, not ", options.consistency->Name()));
  }
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
  OptimizerOptions optimizer = options.optimizer;
  optimizer.schedule.steps_per_epoch = std::max<int64_t>(1, state.steps_per_epoch);
  PS_ASSIGN_OR_RETURN(server->optimizer_, SgdOptimizer::Create(
                                              optimizer, server->layout_->num_parameters, device));
  PS_RETURN_IF_ERROR(server->optimizer_->RestoreMomentum(momentum));
  server->steps_per_epoch_ = state.steps_per_epoch;
  server->version_ = state.version;
  if (options.loss_scale.dynamic && state.loss_scale != 0) {
    // Where the saved server's scale was, so that the steps after the
    // resume are skipped and scaled as they would have been.
    server->loss_scale_ = {state.loss_scale, state.loss_scale_clean_iterations,
                           state.loss_scale_skipped_iterations};
  }
  std::fill(server->chunk_version_.begin(), server->chunk_version_.end(), state.version);
  for (int64_t gc = 0; gc < server->layout_->total_chunks; ++gc) {
    Chunk& chunk = server->layout_->chunks[gc];
    absl::MutexLock chunk_lock(&chunk.mu);
    chunk.version = state.version;
  }
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
  PS_ASSIGN_OR_RETURN(ChunkLayout cut,
                      ChunkLayout::Make(signature, options_.chunk_elements, kMaxParameters));
  auto layout = std::make_unique<Layout>(std::move(cut));
  const int64_t total = layout->num_parameters, chunks = layout->total_chunks;
  // What the layout below allocates per element (the parameters, each
  // iteration slot's sum, the momentum), against the machine's memory: a
  // model that can never fit is refused with its sizes, not met by the
  // out-of-memory killer halfway through zero-filling it.
  const int64_t physical_bytes =
      static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  const int64_t needed_bytes = total * static_cast<int64_t>(sizeof(float)) * (2 + window_);
  if (physical_bytes > 0 && needed_bytes > physical_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the model's ", total, " parameters need at least ", needed_bytes >> 20,
        " MiB on this server (parameters, momentum and ", window_,
        " iteration sums); this machine has ", physical_bytes >> 20, " MiB"));
  }
  // The given tensors laid out in signature order; every parameter needs one.
  std::vector<float> params;
  const bool given = !named_initial_.empty();
  if (given) {
    PS_ASSIGN_OR_RETURN(params, LayOut(named_initial_, *layout));
  }
  layout->chunks = std::make_unique<Chunk[]>(chunks);
  for (int64_t gc = 0; gc < chunks; ++gc) {
    const int64_t offset = layout->chunk_offset[gc], length = layout->chunk_length[gc];
    Chunk& chunk = layout->chunks[gc];
    // Nobody else sees the new layout yet; the lock is for the annotations.
    absl::MutexLock lock(&chunk.mu);
    // One buffer per chunk (see Chunk::buffers), cut from the flat values.
    chunk.buffers = ChunkBuffers(given ? std::vector<float>(params.begin() + offset,
                                                            params.begin() + offset + length)
                                       : std::vector<float>(length, 0.f));
    chunk.slots.resize(window_);
    for (Aggregation& agg : chunk.slots) agg.sum.Reset(length, static_cast<int>(workers_.size()));
    chunk.waived.assign(workers_.size(), false);
  }
  layout_ = std::move(layout);
  chunk_version_.assign(chunks, 0);
  early_elements_ = 0;
  initialized_ = given;
  named_initial_.clear();
  initial_chunks_.Expect(given ? 0 : chunks);
  for (WorkerState& w : workers_) {
    w.slots.assign(window_, WorkerPushes());
    for (WorkerPushes& pushes : w.slots) {
      pushes.pushed.assign(chunks, false);
      pushes.carried.assign(chunks, false);
    }
  }
  iterations_.assign(window_, IterationState());
  for (IterationState& it : iterations_) {
    it.ready.assign(chunks, false);
  }
  applying_.assign(chunks, false);
  return absl::OkStatus();
}

absl::StatusOr<ParameterServer::Registration> ParameterServer::Register(
    const std::string& worker_id, const std::vector<ParamSpec>& signature, int requested_rank,
    int64_t steps_per_epoch) {
  if (worker_id.empty()) return absl::InvalidArgumentError("worker id is empty");
  if (requested_rank >= options_.num_workers) {
    return absl::InvalidArgumentError(absl::StrCat("worker '", worker_id, "' asks for rank ",
                                                   requested_rank, " but the job has ",
                                                   options_.num_workers, " workers"));
  }
  absl::MutexLock lock(&mu_);
  // The model first (the most telling difference), then the data's steps
  // per epoch; the first worker's signature is adopted only once both pass.
  if (layout_ == nullptr) {
    if (signature.empty()) return absl::InvalidArgumentError("worker sent an empty signature");
  } else {
    const std::string diff = SignatureDifference(layout_->signature, signature);
    if (!diff.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("worker '", worker_id, "' has a different model: ", diff));
    }
  }
  PS_RETURN_IF_ERROR(CheckStepsPerEpoch(worker_id, steps_per_epoch, steps_per_epoch_,
                                        options_.optimizer.schedule));
  if (layout_ == nullptr) PS_RETURN_IF_ERROR(AdoptSignatureLocked(signature));
  std::vector<std::string> holders;
  for (const WorkerState& w : workers_) holders.push_back(w.id);
  PS_ASSIGN_OR_RETURN(const int rank, ChooseRank(holders, worker_id, requested_rank));
  // Every check has passed: nothing above changed the workers' state.
  if (optimizer_ == nullptr) {
    OptimizerOptions optimizer = options_.optimizer;
    optimizer.schedule.steps_per_epoch = std::max<int64_t>(1, steps_per_epoch);
    PS_ASSIGN_OR_RETURN(optimizer_,
                        SgdOptimizer::Create(optimizer, layout_->num_parameters, device_));
  }
  // A dropped rank is back in at a step boundary.
  PS_ASSIGN_OR_RETURN(const int64_t joins_at, membership_.Join(rank, version_));
  steps_per_epoch_ = steps_per_epoch;
  WorkerState& worker = workers_[rank];
  if (worker.id == worker_id && initialized_) {
    // A previous process of this worker: what it pushed of the iterations
    // in flight is in the sums already (see Register in the header).
    for (WorkerPushes& pushes : worker.slots) {
      for (size_t gc = 0; gc < pushes.pushed.size(); ++gc) {
        if (pushes.pushed[gc]) pushes.carried[gc] = true;
        pushes.pushed[gc] = false;
      }
    }
  }
  worker.id = worker_id;
  worker.session = sessions_.Issue();
  worker.heard_ns = NowNanos();
  Registration reg;
  reg.rank = rank;
  reg.num_workers = static_cast<int>(workers_.size());
  reg.version = joins_at;
  reg.members = membership_.MembersAt(joins_at, version_);
  reg.chunk_elements = options_.chunk_elements;
  reg.send_initial_parameters = !initialized_ && rank == 0;
  reg.session = worker.session;
  if (reg.send_initial_parameters) {
    // A restarted rank 0 sends everything again.
    initial_chunks_.Restart();
  }
  return reg;
}

bool ParameterServer::RankHeldLocked(int rank) const {
  return rank >= 0 && rank < static_cast<int>(workers_.size()) && !workers_[rank].id.empty();
}

absl::Status ParameterServer::CheckIncarnation(absl::string_view session) const {
  return sessions_.CheckIncarnation(session);
}

absl::Status ParameterServer::CheckSession(int rank, absl::string_view session) const {
  PS_RETURN_IF_ERROR(CheckIncarnation(session));
  absl::MutexLock lock(&mu_);
  if (!RankHeldLocked(rank)) {
    return absl::NotFoundError(absl::StrCat("no worker holds rank ", rank));
  }
  if (!SessionIssuer::Matches(workers_[rank].session, session)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "the session credential is not rank ", rank, "'s (worker '", workers_[rank].id,
        "' registered it since, or it is another worker's)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ParameterServer::FindChunkLocked(int key, int64_t chunk) const {
  if (layout_ == nullptr) return absl::FailedPreconditionError("no model registered yet");
  return layout_->FindChunk(key, chunk);
}

int64_t ParameterServer::GlobalChunkLocked(int key, int64_t chunk) const {
  return layout_ == nullptr ? -1 : layout_->GlobalChunk(key, chunk);
}

absl::Status ParameterServer::AlreadyError(const Layout& layout, const ChunkBytes& chunk,
                                           absl::string_view what) {
  return absl::AlreadyExistsError(absl::StrCat("chunk ", chunk.chunk, " of '",
                                               layout.signature[chunk.key].name, "' already ",
                                               what));
}

absl::Status ParameterServer::CheckChunkShapesLocked(absl::Span<const ChunkBytes> chunks,
                                                     const std::vector<bool>& received,
                                                     absl::string_view what,
                                                     std::vector<int64_t>* global_chunks) const {
  for (size_t c = 0; c < chunks.size(); ++c) {
    const ChunkBytes& chunk = chunks[c];
    PS_ASSIGN_OR_RETURN(const int64_t global_chunk, FindChunkLocked(chunk.key, chunk.chunk));
    const int64_t length = layout_->chunk_length[global_chunk];
    const int64_t bytes = PiecesBytes(chunk.pieces);
    if (bytes != length * static_cast<int64_t>(sizeof(float))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk ", chunk.chunk, " of '", layout_->signature[chunk.key].name, "' needs ", length,
          " elements, got ",
          bytes % sizeof(float) == 0 ? absl::StrCat(bytes / sizeof(float))
                                     : absl::StrCat(bytes, " bytes")));
    }
    bool repeated = received[global_chunk];
    for (const int64_t earlier : *global_chunks) repeated |= earlier == global_chunk;
    if (repeated) return AlreadyError(*layout_, chunk, what);
    global_chunks->push_back(global_chunk);
  }
  return absl::OkStatus();
}

absl::Status ParameterServer::CheckChunkValues(const Layout& layout, int64_t chunk_elements,
                                               absl::Span<const ChunkBytes> chunks, size_t count,
                                               std::vector<bool>* overflow) {
  for (size_t c = 0; c < count; ++c) {
    PS_ASSIGN_OR_RETURN(const bool overflowed,
                        CheckGradientValues(chunks[c].pieces, chunks[c].chunk * chunk_elements,
                                            layout.signature[chunks[c].key].name,
                                            /*loss_scaling=*/overflow != nullptr));
    if (overflowed) (*overflow)[c] = true;
  }
  return absl::OkStatus();
}

absl::Status ParameterServer::Push(int rank, int64_t iteration, int key, int64_t chunk,
                                   int64_t num_samples, absl::Span<const float> gradient) {
  const ChunkData one{key, chunk, gradient};
  return PushChunks(rank, iteration, num_samples, absl::MakeConstSpan(&one, 1));
}

absl::Status ParameterServer::PushChunks(int rank, int64_t iteration, int64_t num_samples,
                                         absl::Span<const ChunkData> chunks) {
  std::vector<absl::string_view> pieces;
  return PushChunkBytes(rank, iteration, num_samples, AsChunkBytes(chunks, &pieces));
}

absl::Status ParameterServer::CheckPushLocked(int rank, int64_t iteration,
                                              int64_t num_samples) const {
  if (!RankHeldLocked(rank)) {
    return absl::NotFoundError(absl::StrCat("push from unregistered worker rank ", rank));
  }
  if (!initialized_) {
    return absl::FailedPreconditionError(
        "push before the initial parameters are complete (version 0 does not exist yet)");
  }
  if (absl::Status ahead = options_.consistency->CheckNotAhead(iteration, version_); !ahead.ok()) {
    return absl::Status(ahead.code(), absl::StrCat(ahead.message(), ", waiting for ranks ",
                                                   absl::StrJoin(RanksMissingLocked(), ", ")));
  }
  if (iteration < version_ || iteration >= version_ + window_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "push for iteration ", iteration, " but the server is at iteration ", version_));
  }
  if (!membership_.participating()[rank]) {
    return absl::AbortedError(absl::StrCat(
        "worker rank ", rank, " takes no part in iteration ", iteration,
        ": it was dropped from the job (lost past the grace period); register again to rejoin "
        "at a step boundary"));
  }
  PS_RETURN_IF_ERROR(CheckPushSamples(num_samples));
  return CheckSameSamples(num_samples, workers_[rank].slots[SlotOf(iteration)].num_samples,
                          absl::StrCat("worker rank ", rank), iteration);
}

std::vector<int> ParameterServer::RanksMissingLocked() const {
  std::vector<int> missing;
  const int64_t total = layout_ == nullptr ? 0 : layout_->total_chunks;
  for (int r = 0; r < static_cast<int>(workers_.size()); ++r) {
    if (!membership_.participating()[r]) continue;
    if (workers_[r].slots.empty() || workers_[r].slots[SlotOf(version_)].chunks < total) {
      missing.push_back(r);
    }
  }
  return missing;
}

absl::Status ParameterServer::CheckPushMessage(int rank, int64_t iteration, int64_t num_samples,
                                               absl::Span<const ChunkBytes> chunks,
                                               const std::string& what, int64_t* start_ns,
                                               const Layout** layout,
                                               std::vector<int64_t>* global_chunks,
                                               std::vector<bool>* overflow) {
  global_chunks->reserve(chunks.size());
  absl::Status shapes;
  // 1. Check the message against the bookkeeping, under mu_: everything
  //    but its values, which it does not read.
  {
    absl::MutexLock lock(&mu_);
    *start_ns = EventStartNanos();
    PS_RETURN_IF_ERROR(CheckPushLocked(rank, iteration, num_samples));
    *layout = layout_.get();
    shapes = CheckChunkShapesLocked(chunks, workers_[rank].slots[SlotOf(iteration)].pushed, what,
                                    global_chunks);
  }
  // 2. Check the values, under no lock (they are the message's own), of
  //    the chunks before any that failed step 1: errors come in chunk order.
  //    Under dynamic loss scaling a value that is not finite is an overflow
  //    of its chunk instead (see LossScaleOptions).
  overflow->assign(chunks.size(), false);
  PS_RETURN_IF_ERROR(CheckChunkValues(**layout, options_.chunk_elements, chunks,
                                      global_chunks->size(),
                                      options_.loss_scale.dynamic ? overflow : nullptr));
  return shapes;
}

absl::Status ParameterServer::ClaimChunksLocked(int rank, int64_t iteration, int64_t num_samples,
                                                absl::Span<const ChunkBytes> chunks,
                                                const std::vector<int64_t>& global_chunks,
                                                const std::string& what,
                                                std::vector<bool>* carried) {
  PS_RETURN_IF_ERROR(CheckPushLocked(rank, iteration, num_samples));
  WorkerState& worker = workers_[rank];
  WorkerPushes& pushes = worker.slots[SlotOf(iteration)];
  for (size_t c = 0; c < chunks.size(); ++c) {
    if (pushes.pushed[global_chunks[c]]) return AlreadyError(*layout_, chunks[c], what);
  }
  // A chunk a previous process of this worker pushed (carried) is claimed
  // but not summed again.
  carried->assign(chunks.size(), false);
  for (size_t c = 0; c < chunks.size(); ++c) {
    const int64_t gc = global_chunks[c];
    pushes.pushed[gc] = true;
    if (pushes.carried[gc]) {
      pushes.carried[gc] = false;
      (*carried)[c] = true;
    } else {
      ++pushes.chunks;
    }
  }
  if (!chunks.empty()) pushes.num_samples = num_samples;
  // The next iteration's members are announced with the first push of
  // this one (workers read them from the replies to split its batch).
  membership_.AnnounceNext();
  worker.heard_ns = worker.last_push_ns = NowNanos();
  worker.last_push_iteration = std::max(worker.last_push_iteration, iteration);
  return absl::OkStatus();
}

absl::Status ParameterServer::PushChunkBytes(int rank, int64_t iteration, int64_t num_samples,
                                             absl::Span<const ChunkBytes> chunks) {
  if (options_.consistency->AppliesEachPush()) {
    return absl::FailedPreconditionError(
        "a synchronous push to an asynchronous server (ApplyNow takes its pushes)");
  }
  const std::string what = absl::StrCat("pushed by worker rank ", rank, " in iteration ", iteration);
  int64_t start_ns = 0;
  const Layout* layout = nullptr;
  std::vector<int64_t> global_chunks;
  std::vector<bool> overflow;
  PS_RETURN_IF_ERROR(CheckPushMessage(rank, iteration, num_samples, chunks, what, &start_ns,
                                      &layout, &global_chunks, &overflow));
  // 3. Claim the chunks, under mu_, after checking again what a concurrent
  //    message of this worker may have changed meanwhile (the iteration,
  //    its samples, its chunks): of two messages with a chunk in common
  //    one is refused here, having added nothing. From here on the message
  //    is added whole.
  SgdOptimizer* optimizer = nullptr;
  std::vector<bool> carried;
  {
    absl::MutexLock lock(&mu_);
    PS_RETURN_IF_ERROR(
        ClaimChunksLocked(rank, iteration, num_samples, chunks, global_chunks, what, &carried));
    optimizer = optimizer_.get();
  }
  // 4. Add each chunk to its sum, in rank order (server/rank_order_sum.h),
  //    under the chunk's lock alone: pushes of different chunks run at once.
  //    A part that completes its chunk as the sum's last term is left for
  //    step 5, which reads it in place inside the update (IsLastTerm).
  const int num_workers = options_.num_workers;
  struct Completed {
    int64_t global_chunk;
    size_t index;            // in the message
    bool last_term_pending;  // this message's part is not in the sum yet
  };
  std::vector<Completed> complete;  // the chunks every worker has now pushed
  for (size_t c = 0; c < chunks.size(); ++c) {
    if (carried[c]) continue;
    Chunk& chunk = layout->chunks[global_chunks[c]];
    absl::MutexLock lock(&chunk.mu);
    Aggregation& agg = chunk.slots[SlotOf(iteration)];
    if (overflow[c]) agg.overflow = true;
    const bool completes = ++agg.pushes + chunk.waived_count == num_workers;
    const bool pending =
        completes && !agg.overflow && agg.sum.IsLastTerm(rank, chunks[c].pieces, chunk.waived);
    if (!pending) SumLocked(rank, chunk, agg, chunks[c].pieces);
    agg.samples += num_samples;
    if (completes) complete.push_back({global_chunks[c], c, pending});
  }
  if (!complete.empty()) {
    // Counted where decided (every member's part in, waived ranks counted
    // as in), before any is applied: a state capture from here on waits for
    // the boundary instead of taking a half-updated model for one.
    absl::MutexLock lock(&mu_);
    iterations_[SlotOf(iteration)].completed += static_cast<int64_t>(complete.size());
  }
  if (options_.observer != nullptr) {
    int64_t bytes = 0;
    for (const ChunkBytes& chunk : chunks) bytes += PiecesBytes(chunk.pieces);
    ReportEvent(EventKind::kServerPush, ServerPushLane(rank), iteration,
                chunks.empty() ? absl::string_view() : layout->signature[chunks[0].key].name,
                bytes, start_ns);
  }
  // 5. Apply and publish each chunk this message completed, in message
  //    order (under ssp:S, once the chunk's earlier iterations are
  //    applied: then with them); the last chunk of the iteration also
  //    publishes the version. A pending last term goes into the update
  //    itself when the update may run now; otherwise (an earlier iteration
  //    of the chunk still to apply, or a state capture holding updates
  //    back) it is added to the sum and the chunk takes the usual path.
  for (const Completed& done : complete) {
    if (done.last_term_pending) {
      const LastTerm last{iteration, chunks[done.index].pieces};
      bool applied = false;
      PS_RETURN_IF_ERROR(AdvanceChunk(*layout, optimizer, done.global_chunk, &last, &applied));
      if (applied) continue;
      Chunk& chunk = layout->chunks[done.global_chunk];
      absl::MutexLock lock(&chunk.mu);
      SumLocked(rank, chunk, chunk.slots[SlotOf(iteration)], last.pieces);
    }
    PS_RETURN_IF_ERROR(CompleteChunk(*layout, optimizer, iteration, done.global_chunk));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ParameterServer::ApplyNow(int rank, int64_t based_on_version,
                                                  int64_t num_samples,
                                                  absl::Span<const ChunkBytes> chunks) {
  if (!options_.consistency->AppliesEachPush()) {
    return absl::FailedPreconditionError("an asynchronous push to a synchronous server");
  }
  const std::string what = absl::StrCat("pushed by worker rank ", rank);
  const Layout* layout = nullptr;
  SgdOptimizer* optimizer = nullptr;
  std::vector<int64_t> global_chunks;
  absl::Status shapes;
  {
    absl::MutexLock lock(&mu_);
    if (!RankHeldLocked(rank)) {
      return absl::NotFoundError(absl::StrCat("push from unregistered worker rank ", rank));
    }
    if (!initialized_) {
      return absl::FailedPreconditionError(
          "push before the initial parameters are complete (version 0 does not exist yet)");
    }
    PS_RETURN_IF_ERROR(CheckPushSamples(num_samples));
    if (based_on_version < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "push claims it was computed from version ", based_on_version, "; versions start at 0"));
    }
    layout = layout_.get();
    optimizer = optimizer_.get();
    // Range, length and repeats within the message; no chunk is "already
    // pushed" in this mode.
    const std::vector<bool> none(layout->total_chunks, false);
    shapes = CheckChunkShapesLocked(chunks, none, what, &global_chunks);
    WorkerState& worker = workers_[rank];
    if (shapes.ok()) worker.heard_ns = worker.last_push_ns = NowNanos();
  }
  PS_RETURN_IF_ERROR(
      CheckChunkValues(*layout, options_.chunk_elements, chunks, global_chunks.size()));
  PS_RETURN_IF_ERROR(shapes);
  int64_t staleness = 0;
  for (size_t c = 0; c < chunks.size(); ++c) {
    const int64_t gc = global_chunks[c];
    const int64_t start_ns = EventStartNanos();
    int64_t version = 0;
    {
      Chunk& chunk = layout->chunks[gc];
      absl::MutexLock lock(&chunk.mu);
      staleness = std::max(staleness, chunk.version - based_on_version);
      if (num_samples > 0 && layout->chunk_length[gc] > 0) {
        std::vector<float>& grad = chunk.slots[0].sum.mutable_values();
        AssignPiecesTo(chunks[c].pieces, grad.data());
        std::shared_ptr<std::vector<float>> next = chunk.buffers.NextBuffer();
        absl::MutexLockMaybe device_lock(device_->num_threads() > 1 ? &device_mu_ : nullptr);
        PS_RETURN_IF_ERROR(optimizer->ApplyRange(chunk.version / options_.num_workers,
                                                 num_samples, layout->chunk_offset[gc], grad,
                                                 *chunk.buffers.current(),
                                                 absl::MakeSpan(*next)));
        chunk.buffers.Publish(std::move(next));
      }
      version = ++chunk.version;
    }
    // Published; the server's version is its chunks' least, which moves
    // only when a chunk at it moves (so the scan is not per update).
    absl::MutexLock lock(&mu_);
    chunk_version_[gc] = version;
    if (version - 1 == version_) {
      const int64_t least = *std::min_element(chunk_version_.begin(), chunk_version_.end());
      if (least != version_) {
        version_ = least;
        version_ns_ = NowNanos();
      }
    }
    ReportEvent(EventKind::kServerUpdate, kServerUpdateLane, version - 1,
                layout->signature[layout->chunk_key[gc]].name,
                layout->chunk_length[gc] * static_cast<int64_t>(sizeof(float)), start_ns);
  }
  return std::max<int64_t>(0, staleness);
}

void ParameterServer::SumLocked(int rank, Chunk& chunk, Aggregation& agg, F32Pieces part) {
  if (agg.overflow) return;  // the update will be skipped: nothing to sum
  early_elements_ += agg.sum.Add(rank, part, chunk.waived);
}

absl::Status ParameterServer::InitializeChunks(int rank, absl::Span<const ChunkData> chunks) {
  std::vector<absl::string_view> pieces;
  return InitializeChunkBytes(rank, AsChunkBytes(chunks, &pieces));
}

absl::Status ParameterServer::InitializeChunkBytes(int rank, absl::Span<const ChunkBytes> chunks) {
  // Once per job, and before anyone may push or pull: all of it under mu_.
  absl::MutexLock lock(&mu_);
  if (!RankHeldLocked(rank)) {
    return absl::NotFoundError(
        absl::StrCat("initial parameters from unregistered worker rank ", rank));
  }
  if (initialized_) {
    return absl::FailedPreconditionError("the initial parameters are already complete");
  }
  if (rank != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker rank ", rank, " sent initial parameters; only rank 0 is asked to"));
  }
  std::vector<int64_t> global_chunks;
  const absl::Status shapes =
      CheckChunkShapesLocked(chunks, initial_chunks_.received(), "sent as an initial value",
                             &global_chunks);
  PS_RETURN_IF_ERROR(
      CheckChunkValues(*layout_, options_.chunk_elements, chunks, global_chunks.size()));
  PS_RETURN_IF_ERROR(shapes);
  for (size_t c = 0; c < chunks.size(); ++c) {
    Chunk& chunk = layout_->chunks[global_chunks[c]];
    absl::MutexLock chunk_lock(&chunk.mu);
    CopyPiecesTo(chunks[c].pieces, chunk.buffers.MutableCurrent().data());
    if (initial_chunks_.Receive(global_chunks[c])) initialized_ = true;
  }
  return absl::OkStatus();
}

absl::Status ParameterServer::CompleteChunk(const Layout& layout, SgdOptimizer* optimizer,
                                            int64_t iteration, int64_t global_chunk) {
  {
    absl::MutexLock lock(&mu_);
    iterations_[SlotOf(iteration)].ready[global_chunk] = true;
  }
  return AdvanceChunk(layout, optimizer, global_chunk, nullptr, nullptr);
}

absl::Status ParameterServer::ApplyAggregationLocked(const Layout& layout, SgdOptimizer* optimizer,
                                                     int64_t iteration, int64_t global_chunk,
                                                     float loss_scale,
                                                     const F32Pieces* last_term, Chunk& chunk,
                                                     bool* skipped) {
  Aggregation& agg = chunk.slots[SlotOf(iteration)];
  *skipped = agg.overflow;
  if (agg.overflow) {
    // An overflow (dynamic loss scaling): the update is skipped, the
    // parameters stay, and the parts held for their turn are dropped.
    chunk.buffers.PublishUnchanged();
    early_elements_ -= agg.sum.DropHeld();
    agg.overflow = false;
  } else if (agg.samples > 0) {
    // Every worker has pushed this chunk, so `samples` covers all of them.
    absl::MutexLockMaybe device_lock(device_->num_threads() > 1 ? &device_mu_ : nullptr);
    // Into the next buffer, keeping these parameters as the previous ones
    // for exact pulls (see PullChunkViews).
    std::shared_ptr<std::vector<float>> next = chunk.buffers.NextBuffer();
    if (last_term != nullptr) {
      // The sum's last term read in place (see RankOrderSum::IsLastTerm).
      PS_RETURN_IF_ERROR(optimizer->ApplyRangeAdding(
          iteration, agg.samples, layout.chunk_offset[global_chunk],
          agg.sum.started() ? agg.sum.values() : absl::Span<const float>(),
          *last_term, *chunk.buffers.current(), absl::MakeSpan(*next), loss_scale > 0 ? loss_scale : 1.f));
    } else {
      PS_RETURN_IF_ERROR(optimizer->ApplyRange(
          iteration, agg.samples, layout.chunk_offset[global_chunk], agg.sum.values(),
          *chunk.buffers.current(), absl::MakeSpan(*next), loss_scale > 0 ? loss_scale : 1.f));
    }
    chunk.buffers.Publish(std::move(next));
  } else {
    // No samples: the parameters stay; version - 1's are the same.
    chunk.buffers.PublishUnchanged();
  }
  chunk.version = iteration + 1;
  agg.pushes = 0;
  agg.sum.Restart();
  agg.samples = 0;
  return absl::OkStatus();
}

absl::Status ParameterServer::AdvanceChunk(const Layout& layout, SgdOptimizer* optimizer,
                                           int64_t global_chunk, const LastTerm* last,
                                           bool* applied_last) {
  for (;;) {
    // 1. Claim the chunk's next update, if it is ready and allowed: its
    //    iteration is the chunk's version (the slot cannot hold a later
    //    iteration's: those need version_ past this one). An iteration
    //    whose last term the caller holds is not marked ready (no other
    //    thread may apply it without that term): it is claimed here, if its
    //    update may run now, or left to the caller.
    int64_t iteration = 0;
    float loss_scale = 0;
    {
      absl::MutexLock lock(&mu_);
      if (applying_[global_chunk]) return absl::OkStatus();  // its applier goes on
      loss_scale = loss_scale_.scale;  // iteration's: loss scaling is sync only
      iteration = chunk_version_[global_chunk];
      IterationState& it = iterations_[SlotOf(iteration)];
      if (last != nullptr) {
        if (iteration != last->iteration || captures_.HoldsBack(iteration)) return absl::OkStatus();
        *applied_last = true;
      } else {
        if (!it.ready[global_chunk]) return absl::OkStatus();
        if (captures_.HoldsBack(iteration)) {
          captures_.NoteHeldBack();  // applied once the capture is served
          return absl::OkStatus();
        }
        it.ready[global_chunk] = false;
      }
      applying_[global_chunk] = true;
    }
    // 2. The update, under the chunk's lock alone.
    const int64_t start_ns = EventStartNanos();
    absl::Status applied;
    bool skipped = false;
    {
      Chunk& chunk = layout.chunks[global_chunk];
      absl::MutexLock lock(&chunk.mu);
      applied = ApplyAggregationLocked(layout, optimizer, iteration, global_chunk, loss_scale,
                                       last != nullptr ? &last->pieces : nullptr, chunk,
                                       &skipped);
    }
    last = nullptr;  // the later iterations (ssp) come summed
    // 3. Publish it; the event is reported under mu_ too, so that once a
    //    version is visible every update event of it is in.
    std::vector<std::function<void(State)>> captures;
    State state;
    bool resume = false;
    {
      absl::MutexLock lock(&mu_);
      applying_[global_chunk] = false;
      if (!applied.ok()) return applied;
      chunk_version_[global_chunk] = iteration + 1;
      IterationState& it = iterations_[SlotOf(iteration)];
      if (skipped) it.overflow = true;
      if (++it.applied == layout.total_chunks) {
        // The iteration's last chunk (iteration == version_: each chunk's
        // iterations are applied in order): every worker's pushes are in.
        FinishIterationLocked(iteration, &captures, &state, &resume);
      }
      ReportEvent(EventKind::kServerUpdate, kServerUpdateLane, iteration,
                  layout.signature[layout.chunk_key[global_chunk]].name,
                  layout.chunk_length[global_chunk] * static_cast<int64_t>(sizeof(float)),
                  start_ns);
    }
    for (auto& done : captures) done(state);
    if (resume) {
      // The updates the capture held back (this chunk's: the loop goes on).
      for (int64_t gc = 0; gc < layout.total_chunks; ++gc) {
        if (gc != global_chunk) {
          PS_RETURN_IF_ERROR(AdvanceChunk(layout, optimizer, gc, nullptr, nullptr));
        }
      }
      absl::MutexLock lock(&mu_);
      captures_.CountRelease();
    }
  }
}

void ParameterServer::FinishIterationLocked(int64_t iteration,
                                            std::vector<std::function<void(State)>>* captures,
                                            State* state, bool* resume) {
  IterationState& it = iterations_[SlotOf(iteration)];
  loss_scale_.Advance(it.overflow, options_.loss_scale.growth_interval);
  it.overflow = false;
  it.applied = 0;
  it.completed = 0;
  for (WorkerState& w : workers_) {
    WorkerPushes& pushes = w.slots[SlotOf(iteration)];
    std::fill(pushes.pushed.begin(), pushes.pushed.end(), false);
    std::fill(pushes.carried.begin(), pushes.carried.end(), false);
    pushes.chunks = 0;
    pushes.num_samples = -1;
  }
  ++version_;
  version_ns_ = NowNanos();
  AdvanceMembershipLocked();
  // The boundary a capture waits for: every chunk at version_, none ahead
  // (the updates past it are held back), nothing moves while the state is
  // copied.
  CaptureRequests::Release release = captures_.AtBoundary(version_);
  if (!release.captures.empty()) {
    CopyStateLocked(state);
    *captures = std::move(release.captures);
  }
  *resume = release.resume;
}

void ParameterServer::CopyStateLocked(State* state) {
  state->version = version_;
  state->steps_per_epoch = std::max<int64_t>(0, steps_per_epoch_);
  state->loss_scale = loss_scale_.scale;
  state->loss_scale_clean_iterations = loss_scale_.clean_iterations;
  state->loss_scale_skipped_iterations = loss_scale_.skipped_iterations;
  state->signature = layout_->signature;
  state->parameters.resize(layout_->num_parameters);
  for (int64_t gc = 0; gc < layout_->total_chunks; ++gc) {
    Chunk& chunk = layout_->chunks[gc];
    absl::MutexLock chunk_lock(&chunk.mu);
    const std::vector<float>& params = *chunk.buffers.current();
    std::copy(params.begin(), params.end(),
              state->parameters.begin() + layout_->chunk_offset[gc]);
  }
  state->momentum.clear();
  if (optimizer_ != nullptr) {
    const absl::Span<const float> momentum = optimizer_->momentum();
    state->momentum.assign(momentum.begin(), momentum.end());
  } else if (options_.optimizer.sgd.momentum != 0) {
    state->momentum.assign(layout_->num_parameters, 0.f);  // no update yet
  }
}

void ParameterServer::CaptureState(std::function<void(State)> done) {
  std::vector<std::function<void(State)>> captures;
  State state;
  {
    absl::MutexLock lock(&mu_);
    captures_.Add(std::move(done));
    // At a boundary now (version 0 exists, no chunk of the iteration in
    // progress completed, so none is ahead of it): served here. Otherwise
    // by the push that completes the iteration at which no chunk is ahead,
    // the updates past it held back until then; or, before version 0, once
    // version 1 exists.
    if (!initialized_ || iterations_[SlotOf(version_)].completed > 0) {
      // The least version no chunk can pass: a chunk is at its published
      // version, or one further while its update is being applied.
      int64_t limit = version_ + 1;
      for (size_t gc = 0; gc < chunk_version_.size(); ++gc) {
        limit = std::max(limit, chunk_version_[gc] + (applying_[gc] ? 1 : 0));
      }
      captures_.HoldBackFrom(limit);
      return;
    }
    CopyStateLocked(&state);
    captures = captures_.TakeAll();
  }
  for (auto& capture : captures) capture(state);
}

int ParameterServer::CancelCaptures() {
  const Layout* layout = nullptr;
  SgdOptimizer* optimizer = nullptr;
  int n = 0;
  {
    absl::MutexLock lock(&mu_);
    if (!captures_.Cancel(&n).resume) return n;
    layout = layout_.get();
    optimizer = optimizer_.get();
  }
  // The updates the dropped captures held back.
  for (int64_t gc = 0; gc < layout->total_chunks; ++gc) {
    const absl::Status applied = AdvanceChunk(*layout, optimizer, gc, nullptr, nullptr);
    if (!applied.ok()) break;  // an optimizer invariant; the pushes report theirs
  }
  absl::MutexLock lock(&mu_);
  captures_.CountRelease();
  return n;
}

int64_t ParameterServer::held_back_releases() const {
  absl::MutexLock lock(&mu_);
  return captures_.releases();
}

absl::Status ParameterServer::AwaitVersionLocked(int64_t version, absl::Time deadline) {
  auto ready = [this, version]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return version_ >= version && initialized_;
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&ready), deadline)) {
    return VersionMissingErrorLocked(version);
  }
  return absl::OkStatus();
}

absl::Status ParameterServer::VersionMissingErrorLocked(int64_t version) const {
  if (!initialized_) {
    return absl::DeadlineExceededError(absl::StrCat(
        "version ", version, " not reached before the deadline: the initial parameters are ",
        layout_ == nullptr ? "not known (no worker has registered)"
                           : "incomplete (rank 0 has not sent them all)"));
  }
  return absl::DeadlineExceededError(absl::StrCat("version ", version,
                                                  " not reached before the deadline; the "
                                                  "server is at version ",
                                                  version_));
}

bool ParameterServer::ChunksReadyLocked(int64_t version,
                                        absl::Span<const ChunkId> chunks) const {
  if (chunks.empty()) return version_ >= version;
  for (const ChunkId& chunk : chunks) {
    const int64_t gc = GlobalChunkLocked(chunk.key, chunk.chunk);
    if (gc >= 0 && chunk_version_[gc] < version) return false;
  }
  return true;
}

absl::StatusOr<std::vector<int64_t>> ParameterServer::AwaitChunksLocked(
    int64_t version, absl::Time deadline, absl::Span<const ChunkId> chunks) {
  // A chunk that does not exist is refused before any wait; without a
  // signature no chunk is known yet, so it is checked after the wait for
  // version 0 (which needs the signature).
  auto check = [this, chunks]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
    for (const ChunkId& chunk : chunks) {
      PS_RETURN_IF_ERROR(FindChunkLocked(chunk.key, chunk.chunk).status());
    }
    return absl::OkStatus();
  };
  if (layout_ != nullptr) PS_RETURN_IF_ERROR(check());
  auto ready = [this, version, chunks]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return initialized_ && ChunksReadyLocked(version, chunks);
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&ready), deadline)) {
    // Name what is missing: version 0, the server's version, or a chunk.
    if (!initialized_ || chunks.empty()) return VersionMissingErrorLocked(version);
    for (const ChunkId& chunk : chunks) {
      const int64_t gc = GlobalChunkLocked(chunk.key, chunk.chunk);
      if (gc >= 0 && chunk_version_[gc] < version) {
        return absl::DeadlineExceededError(absl::StrCat(
            "version ", version, " of chunk ", chunk.chunk, " of '",
            layout_->signature[chunk.key].name,
            "' not reached before the deadline; the chunk is at version ", chunk_version_[gc],
            ", the server at version ", version_));
      }
    }
  }
  // The signature may have come during the wait.
  PS_RETURN_IF_ERROR(check());
  std::vector<int64_t> global_chunks;
  global_chunks.reserve(chunks.size());
  for (const ChunkId& chunk : chunks) {
    global_chunks.push_back(GlobalChunkLocked(chunk.key, chunk.chunk));
  }
  return global_chunks;
}

absl::StatusOr<int64_t> ParameterServer::PullChunks(int64_t version, absl::Time deadline,
                                                    absl::Span<const ChunkOut> chunks) {
  std::vector<ChunkId> ids;
  ids.reserve(chunks.size());
  for (const ChunkOut& chunk : chunks) ids.push_back({chunk.key, chunk.chunk});
  const Layout* layout = nullptr;
  std::vector<int64_t> global_chunks;
  int64_t pulled = 0;
  {
    absl::MutexLock lock(&mu_);
    PS_ASSIGN_OR_RETURN(global_chunks, AwaitChunksLocked(version, deadline, ids));
    layout = layout_.get();
    pulled = version_;  // an empty request's answer
  }
  const int64_t start_ns = EventStartNanos();
  for (size_t c = 0; c < chunks.size(); ++c) {
    const int64_t length = layout->chunk_length[global_chunks[c]];
    if (static_cast<int64_t>(chunks[c].out.size()) != length) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk ", chunks[c].chunk, " of '", layout->signature[chunks[c].key].name, "' has ",
          length, " elements, buffer ", chunks[c].out.size()));
    }
  }
  // Each chunk copied under its own lock, at its version then.
  int64_t elements = 0;
  for (size_t c = 0; c < chunks.size(); ++c) {
    Chunk& chunk = layout->chunks[global_chunks[c]];
    absl::MutexLock lock(&chunk.mu);
    const std::vector<float>& params = *chunk.buffers.current();
    std::memcpy(chunks[c].out.data(), params.data(), params.size() * sizeof(float));
    elements += static_cast<int64_t>(params.size());
    pulled = c == 0 ? chunk.version : std::min(pulled, chunk.version);
  }
  ReportEvent(EventKind::kServerPull, kServerPullLane, pulled,
              chunks.empty() ? absl::string_view() : layout->signature[chunks[0].key].name,
              elements * static_cast<int64_t>(sizeof(float)), start_ns);
  return pulled;
}

absl::StatusOr<int64_t> ParameterServer::WaitForVersion(int64_t version, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  PS_RETURN_IF_ERROR(AwaitVersionLocked(version, deadline));
  return version_;
}

absl::StatusOr<int64_t> ParameterServer::Pull(int64_t version, absl::Time deadline,
                                              absl::Span<float> out) {
  const Layout* layout = nullptr;
  int64_t pulled = 0;
  {
    absl::MutexLock lock(&mu_);
    PS_RETURN_IF_ERROR(AwaitVersionLocked(version, deadline));
    layout = layout_.get();
    pulled = version_;
  }
  const int64_t start_ns = EventStartNanos();
  if (static_cast<int64_t>(out.size()) != layout->num_parameters) {
    return absl::InvalidArgumentError(absl::StrCat("pull into ", out.size(),
                                                   " elements; the model has ",
                                                   layout->num_parameters));
  }
  // Each chunk at least version `pulled` (one may be newer by now).
  for (int64_t gc = 0; gc < layout->total_chunks; ++gc) {
    Chunk& chunk = layout->chunks[gc];
    absl::MutexLock lock(&chunk.mu);
    const std::vector<float>& params = *chunk.buffers.current();
    std::memcpy(out.data() + layout->chunk_offset[gc], params.data(),
                params.size() * sizeof(float));
  }
  ReportEvent(EventKind::kServerPull, kServerPullLane, pulled, layout->signature[0].name,
              layout->num_parameters * static_cast<int64_t>(sizeof(float)), start_ns);
  return pulled;
}

absl::StatusOr<ParameterServer::ChunkViews> ParameterServer::PullChunkViews(
    int64_t version, absl::Time deadline, absl::Span<const ChunkId> chunks, bool exact,
    bool with_previous) {
  const Layout* layout = nullptr;
  std::vector<int64_t> global_chunks;
  ChunkViews views;
  {
    absl::MutexLock lock(&mu_);
    PS_ASSIGN_OR_RETURN(global_chunks, AwaitChunksLocked(version, deadline, chunks));
    layout = layout_.get();
    views.version = version_;  // an empty request's answer
  }
  const int64_t start_ns = EventStartNanos();
  // The views keep exactly the chunks they view alive: an update of any
  // other chunk writes in place. Each is taken under its chunk's lock, at
  // its version then.
  auto held = std::make_shared<std::vector<std::shared_ptr<const std::vector<float>>>>();
  held->reserve(chunks.size());
  views.chunks.reserve(chunks.size());
  int64_t elements = 0;
  for (size_t c = 0; c < global_chunks.size(); ++c) {
    Chunk& chunk = layout->chunks[global_chunks[c]];
    absl::MutexLock lock(&chunk.mu);
    std::shared_ptr<std::vector<float>> params = chunk.buffers.current();
    const std::shared_ptr<std::vector<float>>& previous = chunk.buffers.previous();
    if (exact && chunk.version != version) {
      if (chunk.version != version + 1 || previous == nullptr) {
        return absl::FailedPreconditionError(absl::StrCat(
            "version ", version, " of chunk ", chunks[c].chunk, " of '",
            layout->signature[chunks[c].key].name, "' is gone: the chunk is at version ",
            chunk.version));
      }
      params = previous;
    }
    views.chunks.push_back(absl::MakeConstSpan(*params));
    elements += static_cast<int64_t>(params->size());
    held->push_back(std::move(params));
    if (with_previous) {
      // `previous` is version - 1 exactly when the chunk is at `version`
      // (the no-sample and skipped updates keep the same buffer: no change).
      const bool delta = chunk.version == version && previous != nullptr;
      views.previous.push_back(delta ? absl::MakeConstSpan(*previous)
                                     : absl::Span<const float>());
      if (delta) held->push_back(previous);
    }
    views.version = exact ? version
                          : (c == 0 ? chunk.version : std::min(views.version, chunk.version));
  }
  views.keep_alive = std::move(held);
  ReportEvent(EventKind::kServerPull, kServerPullLane, views.version,
              chunks.empty() ? absl::string_view() : layout->signature[chunks[0].key].name,
              elements * static_cast<int64_t>(sizeof(float)), start_ns);
  return views;
}

bool ParameterServer::HasChunks(int64_t version, absl::Span<const ChunkId> chunks) const {
  absl::MutexLock lock(&mu_);
  if (layout_ != nullptr) {
    for (const ChunkId& chunk : chunks) {
      if (GlobalChunkLocked(chunk.key, chunk.chunk) < 0) return true;  // refused at once
    }
  }
  return initialized_ && ChunksReadyLocked(version, chunks);
}

bool ParameterServer::HasVersion(int64_t version) const {
  absl::MutexLock lock(&mu_);
  return initialized_ && version_ >= version;
}

std::vector<ParamSpec> ParameterServer::signature() const {
  absl::MutexLock lock(&mu_);
  return layout_ == nullptr ? std::vector<ParamSpec>() : layout_->signature;
}

int64_t ParameterServer::steps_per_epoch() const {
  absl::MutexLock lock(&mu_);
  return steps_per_epoch_;
}

int64_t ParameterServer::version() const {
  absl::MutexLock lock(&mu_);
  return version_;
}

ParameterServer::LossScale ParameterServer::loss_scale() const {
  absl::MutexLock lock(&mu_);
  return {version_, loss_scale_.scale, loss_scale_.skipped_iterations};
}

int64_t ParameterServer::EventStartNanos() const {
  return options_.observer != nullptr ? options_.clock->NowNanos() : 0;
}

void ParameterServer::ReportEvent(EventKind kind, int32_t lane, int64_t step,
                                  absl::string_view name, int64_t bytes, int64_t start_ns) const {
  if (options_.observer == nullptr) return;
  TimedEvent event;
  event.kind = kind;
  event.lane = lane;
  event.step = step;
  event.name = name;
  event.start_ns = start_ns;
  event.end_ns = options_.clock->NowNanos();
  event.bytes = bytes;
  options_.observer->OnEvent(event);
}

int64_t ParameterServer::held_elements() const { return early_elements_.load(); }

bool ParameterServer::initialized() const {
  absl::MutexLock lock(&mu_);
  return initialized_;
}

int64_t ParameterServer::num_parameters() const {
  absl::MutexLock lock(&mu_);
  return layout_ == nullptr ? 0 : layout_->num_parameters;
}

int64_t ParameterServer::ChunkLength(int key, int64_t chunk) const {
  absl::MutexLock lock(&mu_);
  const absl::StatusOr<int64_t> global_chunk = FindChunkLocked(key, chunk);
  return global_chunk.ok() ? layout_->chunk_length[*global_chunk] : -1;
}

int64_t ParameterServer::NumChunks(int key) const {
  absl::MutexLock lock(&mu_);
  if (layout_ == nullptr || key < 0 || key >= static_cast<int>(layout_->signature.size())) {
    return 0;
  }
  return ChunkCount(NumElements(layout_->signature[key].shape), options_.chunk_elements);
}

}  // namespace ps::server
