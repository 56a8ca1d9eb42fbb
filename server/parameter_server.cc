#include "server/parameter_server.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/f32_pieces.h"

namespace ps::server {
namespace {

// Describes the first difference between two signatures, or "" if equal.
std::string SignatureDifference(const std::vector<ParamSpec>& server,
                                const std::vector<ParamSpec>& worker) {
  const size_t n = std::min(server.size(), worker.size());
  for (size_t i = 0; i < n; ++i) {
    const ParamSpec& s = server[i];
    const ParamSpec& w = worker[i];
    if (s.name != w.name) {
      return absl::StrCat("parameter ", i, " is '", s.name, "' on the server but '", w.name,
                          "' on the worker");
    }
    if (s.shape != w.shape) {
      return absl::StrCat("parameter '", s.name, "' has shape ", ShapeToString(s.shape),
                          " on the server but ", ShapeToString(w.shape), " on the worker");
    }
    if (s.dtype != w.dtype) {
      return absl::StrCat("parameter '", s.name, "' has dtype ", DTypeName(s.dtype),
                          " on the server but ", DTypeName(w.dtype), " on the worker");
    }
  }
  if (server.size() != worker.size()) {
    return absl::StrCat("the server's model has ", server.size(), " parameters, the worker's ",
                        worker.size());
  }
  return "";
}

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
    : options_(options), device_(device) {}

absl::StatusOr<std::unique_ptr<ParameterServer>> ParameterServer::Create(
    const ParameterServerOptions& options, CpuDevice* device) {
  if (options.num_workers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_workers must be >= 1, got ", options.num_workers));
  }
  if (options.chunk_elements < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_elements must be >= 1, got ", options.chunk_elements));
  }
  if (options.observer != nullptr && options.clock == nullptr) {
    return absl::InvalidArgumentError("an event observer needs a clock");
  }
  PS_RETURN_IF_ERROR(ValidateOptimizerOptions(options.optimizer));
  std::unique_ptr<ParameterServer> server(new ParameterServer(options, device));
  server->workers_.resize(options.num_workers);
  return server;
}

absl::StatusOr<std::unique_ptr<ParameterServer>> ParameterServer::Create(
    const ParameterServerOptions& options, std::vector<ParamSpec> signature,
    std::vector<float> initial, CpuDevice* device) {
  std::vector<NamedTensor> named;
  int64_t offset = 0;
  for (const ParamSpec& spec : signature) {
    const int64_t n = NumElements(spec.shape);
    if (offset + n > static_cast<int64_t>(initial.size())) {
      return absl::InvalidArgumentError(absl::StrCat("initial parameters have ", initial.size(),
                                                     " elements but the signature needs more"));
    }
    named.push_back({spec.name, spec.shape,
                     std::vector<float>(initial.begin() + offset, initial.begin() + offset + n)});
    offset += n;
  }
  if (offset != static_cast<int64_t>(initial.size())) {
    return absl::InvalidArgumentError(absl::StrCat("initial parameters have ", initial.size(),
                                                   " elements but the signature needs ", offset));
  }
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
  for (const NamedTensor& t : initial) {
    if (NumElements(t.shape) != static_cast<int64_t>(t.values.size())) {
      return absl::InvalidArgumentError(absl::StrCat("initial tensor '", t.name, "' of shape ",
                                                     ShapeToString(t.shape), " has ",
                                                     t.values.size(), " values"));
    }
    for (size_t i = 0; i < t.values.size(); ++i) {
      if (!std::isfinite(t.values[i])) {
        return absl::InvalidArgumentError(
            absl::StrCat("initial tensor '", t.name, "' element ", i, " is not finite"));
      }
    }
  }
  PS_ASSIGN_OR_RETURN(std::unique_ptr<ParameterServer> server, Create(options, device));
  absl::MutexLock lock(&server->mu_);
  server->named_initial_ = std::move(initial);
  return server;
}

absl::Status ParameterServer::AdoptSignatureLocked(const std::vector<ParamSpec>& signature) {
  if (signature.empty()) return absl::InvalidArgumentError("the signature is empty");
  std::vector<int64_t> offsets, first_chunks;
  int64_t total = 0, chunks = 0;
  for (const ParamSpec& spec : signature) {
    if (spec.dtype != DType::kF32) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", spec.name, "' is ",
                                                     DTypeName(spec.dtype),
                                                     "; the server stores F32 only"));
    }
    offsets.push_back(total);
    first_chunks.push_back(chunks);
    const int64_t n = NumElements(spec.shape);
    total += n;
    chunks += ChunkCount(n, options_.chunk_elements);
  }
  std::vector<float> params;
  const bool given = !named_initial_.empty();
  if (given) {
    // Lay the given tensors out in signature order; every parameter needs one.
    params.resize(total);
    for (size_t key = 0; key < signature.size(); ++key) {
      const ParamSpec& spec = signature[key];
      auto it = std::find_if(named_initial_.begin(), named_initial_.end(),
                             [&](const NamedTensor& t) { return t.name == spec.name; });
      if (it == named_initial_.end()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "the server's initial parameters have no '", spec.name, "', which the worker's model has"));
      }
      if (it->shape != spec.shape) {
        return absl::FailedPreconditionError(absl::StrCat(
            "parameter '", spec.name, "' has shape ", ShapeToString(it->shape),
            " on the server but ", ShapeToString(spec.shape), " on the worker"));
      }
      std::copy(it->values.begin(), it->values.end(), params.begin() + offsets[key]);
    }
  }
  // One buffer per chunk (see chunk_params_), cut from the flat values.
  std::vector<int> chunk_key;
  std::vector<int64_t> chunk_offset;
  std::vector<std::shared_ptr<std::vector<float>>> chunk_params;
  chunk_key.reserve(chunks);
  chunk_offset.reserve(chunks);
  chunk_params.reserve(chunks);
  for (size_t key = 0; key < signature.size(); ++key) {
    const int64_t n = NumElements(signature[key].shape);
    for (int64_t begin = 0, c = 0; c < ChunkCount(n, options_.chunk_elements);
         ++c, begin += options_.chunk_elements) {
      const int64_t length = std::min(options_.chunk_elements, n - begin);
      const int64_t offset = offsets[key] + begin;
      chunk_key.push_back(static_cast<int>(key));
      chunk_offset.push_back(offset);
      chunk_params.push_back(
          given ? std::make_shared<std::vector<float>>(params.begin() + offset,
                                                       params.begin() + offset + length)
                : std::make_shared<std::vector<float>>(length, 0.f));
    }
  }
  signature_ = signature;
  key_offset_ = std::move(offsets);
  key_first_chunk_ = std::move(first_chunks);
  total_chunks_ = chunks;
  num_parameters_ = total;
  chunk_key_ = std::move(chunk_key);
  chunk_offset_ = std::move(chunk_offset);
  chunk_params_ = std::move(chunk_params);
  chunk_version_.assign(chunks, 0);
  grad_sum_.assign(total, 0.f);
  chunk_pushes_.assign(chunks, 0);
  ranks_summed_.assign(chunks, 0);
  chunks_applied_ = 0;
  early_.assign(chunks, std::vector<std::vector<float>>(workers_.size()));
  early_elements_ = 0;
  initialized_ = given;
  named_initial_.clear();
  initial_received_.assign(given ? 0 : chunks, false);
  initial_chunks_received_ = 0;
  for (WorkerState& w : workers_) {
    w.pushed.assign(chunks, false);
    w.num_samples = -1;
  }
  return absl::OkStatus();
}

absl::Status ParameterServer::CheckStepsPerEpochLocked(const std::string& worker_id,
                                                       int64_t steps_per_epoch) {
  if (steps_per_epoch < 0) {
    return absl::InvalidArgumentError(absl::StrCat("worker '", worker_id, "' states ",
                                                   steps_per_epoch, " steps per epoch"));
  }
  if (steps_per_epoch_ >= 0 && steps_per_epoch != steps_per_epoch_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker '", worker_id, "' has ", steps_per_epoch, " steps per epoch but the job has ",
        steps_per_epoch_, " (do the workers' datasets and --batch_size agree?)"));
  }
  const LrSchedule& schedule = options_.optimizer.schedule;
  if (schedule.unit == LrSchedule::Unit::kEpochs && schedule.step_size > 0 &&
      steps_per_epoch < 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the learning rate decays every ", schedule.step_size, " epochs, but worker '", worker_id,
        "' states no steps per epoch"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ParameterServer::Registration> ParameterServer::Register(
    const std::string& worker_id, const std::vector<ParamSpec>& signature, int requested_rank,
    int64_t steps_per_epoch) {
  if (worker_id.empty()) return absl::InvalidArgumentError("worker id is empty");
  if (requested_rank >= static_cast<int>(workers_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("worker '", worker_id, "' asks for rank ",
                                                   requested_rank, " but the job has ",
                                                   workers_.size(), " workers"));
  }
  absl::MutexLock lock(&mu_);
  // The model first (the most telling difference), then the data's steps
  // per epoch; the first worker's signature is adopted only once both pass.
  if (signature_.empty()) {
    if (signature.empty()) return absl::InvalidArgumentError("worker sent an empty signature");
  } else {
    const std::string diff = SignatureDifference(signature_, signature);
    if (!diff.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("worker '", worker_id, "' has a different model: ", diff));
    }
  }
  PS_RETURN_IF_ERROR(CheckStepsPerEpochLocked(worker_id, steps_per_epoch));
  if (signature_.empty()) PS_RETURN_IF_ERROR(AdoptSignatureLocked(signature));
  int rank = -1;
  for (int r = 0; r < static_cast<int>(workers_.size()); ++r) {
    if (workers_[r].id == worker_id) rank = r;
  }
  if (requested_rank >= 0 && rank != requested_rank) {
    if (rank >= 0) {
      return absl::AlreadyExistsError(absl::StrCat("worker '", worker_id, "' holds rank ", rank,
                                                   " and cannot move to rank ", requested_rank));
    }
    if (!workers_[requested_rank].id.empty()) {
      return absl::AlreadyExistsError(absl::StrCat("rank ", requested_rank,
                                                   " is already held by worker '",
                                                   workers_[requested_rank].id, "'"));
    }
    rank = requested_rank;
  }
  if (rank < 0) {
    for (int r = 0; r < static_cast<int>(workers_.size()); ++r) {
      if (workers_[r].id.empty()) {
        rank = r;
        break;
      }
    }
  }
  if (rank < 0) {
    return absl::ResourceExhaustedError(absl::StrCat("worker '", worker_id, "' refused: all ",
                                                     workers_.size(),
                                                     " worker slots are registered"));
  }
  // Every check has passed: nothing above changed the workers' state.
  if (optimizer_ == nullptr) {
    OptimizerOptions optimizer = options_.optimizer;
    optimizer.schedule.steps_per_epoch = std::max<int64_t>(1, steps_per_epoch);
    PS_ASSIGN_OR_RETURN(optimizer_, SgdOptimizer::Create(optimizer, num_parameters_, device_));
  }
  steps_per_epoch_ = steps_per_epoch;
  workers_[rank].id = worker_id;
  Registration reg;
  reg.rank = rank;
  reg.num_workers = static_cast<int>(workers_.size());
  reg.version = version_;
  reg.chunk_elements = options_.chunk_elements;
  reg.send_initial_parameters = !initialized_ && rank == 0;
  if (reg.send_initial_parameters) {
    // A restarted rank 0 sends everything again.
    std::fill(initial_received_.begin(), initial_received_.end(), false);
    initial_chunks_received_ = 0;
  }
  return reg;
}

absl::Status ParameterServer::CheckKeyChunkLocked(int key, int64_t chunk, int64_t* offset,
                                                  int64_t* length) const {
  if (signature_.empty()) return absl::FailedPreconditionError("no model registered yet");
  if (key < 0 || key >= static_cast<int>(signature_.size())) {
    return absl::OutOfRangeError(
        absl::StrCat("key ", key, " out of range: the model has ", signature_.size(), " keys"));
  }
  const int64_t n = NumElements(signature_[key].shape);
  const int64_t chunks = ChunkCount(n, options_.chunk_elements);
  if (chunk < 0 || chunk >= chunks) {
    return absl::OutOfRangeError(absl::StrCat("chunk ", chunk, " of key '", signature_[key].name,
                                              "' out of range: it has ", chunks, " chunks"));
  }
  *offset = chunk * options_.chunk_elements;
  *length = std::min(options_.chunk_elements, n - *offset);
  return absl::OkStatus();
}

int64_t ParameterServer::GlobalChunkLocked(int key, int64_t chunk) const {
  if (key < 0 || key >= static_cast<int>(signature_.size())) return -1;
  const int64_t first = key_first_chunk_[key];
  const int64_t end =
      key + 1 < static_cast<int>(signature_.size()) ? key_first_chunk_[key + 1] : total_chunks_;
  if (chunk < 0 || chunk >= end - first) return -1;
  return first + chunk;
}

absl::StatusOr<std::vector<ParameterServer::CheckedChunk>> ParameterServer::CheckChunksLocked(
    absl::Span<const ChunkBytes> chunks, const std::vector<bool>& received,
    absl::string_view what) const {
  std::vector<CheckedChunk> checked(chunks.size());
  for (size_t c = 0; c < chunks.size(); ++c) {
    const ChunkBytes& chunk = chunks[c];
    int64_t offset, length;
    PS_RETURN_IF_ERROR(CheckKeyChunkLocked(chunk.key, chunk.chunk, &offset, &length));
    const std::string& name = signature_[chunk.key].name;
    const int64_t bytes = PiecesBytes(chunk.pieces);
    if (bytes != length * static_cast<int64_t>(sizeof(float))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk ", chunk.chunk, " of '", name, "' needs ", length, " elements, got ",
          bytes % sizeof(float) == 0 ? absl::StrCat(bytes / sizeof(float))
                                     : absl::StrCat(bytes, " bytes")));
    }
    const int64_t global_chunk = key_first_chunk_[chunk.key] + chunk.chunk;
    bool repeated = received[global_chunk];
    for (size_t earlier = 0; earlier < c; ++earlier) {
      repeated |= checked[earlier].global_chunk == global_chunk;
    }
    if (repeated) {
      return absl::AlreadyExistsError(
          absl::StrCat("chunk ", chunk.chunk, " of '", name, "' already ", what));
    }
    float bad = 0.f;
    if (const int64_t i = FirstNonFinite(chunk.pieces, &bad); i >= 0) {
      return absl::InvalidArgumentError(absl::StrCat("element ", offset + i, " of '", name,
                                                     "' is ", bad,
                                                     "; refusing a non-finite value"));
    }
    checked[c] = {key_offset_[chunk.key] + offset, global_chunk};
  }
  return checked;
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

absl::Status ParameterServer::PushChunkBytes(int rank, int64_t iteration, int64_t num_samples,
                                             absl::Span<const ChunkBytes> chunks) {
  absl::MutexLock lock(&mu_);
  const int64_t start_ns = EventStartNanos();
  if (rank < 0 || rank >= static_cast<int>(workers_.size()) || workers_[rank].id.empty()) {
    return absl::NotFoundError(absl::StrCat("push from unregistered worker rank ", rank));
  }
  WorkerState& worker = workers_[rank];
  // 1. Check every chunk; nothing changes until all pass.
  if (!initialized_) {
    return absl::FailedPreconditionError(
        "push before the initial parameters are complete (version 0 does not exist yet)");
  }
  if (iteration != version_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "push for iteration ", iteration, " but the server is at iteration ", version_));
  }
  if (num_samples < 0 || (worker.num_samples >= 0 && num_samples != worker.num_samples)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "push claims ", num_samples, " samples but worker rank ", rank, " claimed ",
        worker.num_samples, " earlier in iteration ", iteration));
  }
  PS_ASSIGN_OR_RETURN(
      std::vector<CheckedChunk> checked,
      CheckChunksLocked(chunks, worker.pushed,
                        absl::StrCat("pushed by worker rank ", rank, " in iteration ", iteration)));
  // 2. All valid: add them, in rank order (see SumInRankOrderLocked).
  if (!chunks.empty()) worker.num_samples = num_samples;
  const int num_workers = static_cast<int>(workers_.size());
  std::vector<int64_t> complete;  // the chunks every worker has now pushed
  for (size_t c = 0; c < chunks.size(); ++c) {
    const int64_t gc = checked[c].global_chunk;
    SumInRankOrderLocked(rank, checked[c], chunks[c].pieces);
    worker.pushed[gc] = true;
    if (++chunk_pushes_[gc] == num_workers) complete.push_back(gc);
  }
  if (options_.observer != nullptr) {
    int64_t bytes = 0;
    for (const ChunkBytes& chunk : chunks) bytes += PiecesBytes(chunk.pieces);
    ReportEvent(EventKind::kServerPush, ServerPushLane(rank), iteration,
                chunks.empty() ? absl::string_view() : signature_[chunks[0].key].name, bytes,
                start_ns);
  }
  // 3. Apply and publish each chunk this message completed, in message
  //    order; the last chunk of the iteration also publishes the version.
  for (const int64_t gc : complete) PS_RETURN_IF_ERROR(ApplyChunkLocked(gc));
  return absl::OkStatus();
}

void ParameterServer::SumInRankOrderLocked(int rank, const CheckedChunk& chunk,
                                           absl::Span<const absl::string_view> data) {
  const int64_t n = PiecesBytes(data) / static_cast<int64_t>(sizeof(float));
  if (n == 0) return;  // an empty tensor: nothing to sum, in any order
  const int64_t gc = chunk.global_chunk;
  if (ranks_summed_[gc] != rank) {
    // A lower rank's chunk is still missing: hold this one until its turn.
    early_[gc][rank].resize(n);
    CopyPiecesTo(data, early_[gc][rank].data());
    early_elements_ += n;
    return;
  }
  float* sum = grad_sum_.data() + chunk.offset;
  // Rank 0 starts the sum: 0 + g_0 written without reading the old sum, so
  // the sum needs no zeroing between iterations.
  if (rank == 0) {
    AssignPiecesTo(data, sum);
  } else {
    AddPiecesTo(data, sum);
  }
  ++ranks_summed_[gc];
  // Then every held chunk whose turn has come.
  const int num_workers = static_cast<int>(workers_.size());
  while (ranks_summed_[gc] < num_workers && !early_[gc][ranks_summed_[gc]].empty()) {
    std::vector<float> held = std::move(early_[gc][ranks_summed_[gc]]);
    early_[gc][ranks_summed_[gc]] = std::vector<float>();
    for (int64_t i = 0; i < n; ++i) sum[i] += held[i];
    early_elements_ -= n;
    ++ranks_summed_[gc];
  }
}

absl::Status ParameterServer::InitializeChunks(int rank, absl::Span<const ChunkData> chunks) {
  std::vector<absl::string_view> pieces;
  return InitializeChunkBytes(rank, AsChunkBytes(chunks, &pieces));
}

absl::Status ParameterServer::InitializeChunkBytes(int rank, absl::Span<const ChunkBytes> chunks) {
  absl::MutexLock lock(&mu_);
  if (rank < 0 || rank >= static_cast<int>(workers_.size()) || workers_[rank].id.empty()) {
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
  PS_ASSIGN_OR_RETURN(std::vector<CheckedChunk> checked,
                      CheckChunksLocked(chunks, initial_received_, "sent as an initial value"));
  for (size_t c = 0; c < chunks.size(); ++c) {
    CopyPiecesTo(chunks[c].pieces, MutableChunkLocked(checked[c].global_chunk).data());
    initial_received_[checked[c].global_chunk] = true;
    ++initial_chunks_received_;
  }
  if (initial_chunks_received_ == total_chunks_) {
    initialized_ = true;
    initial_received_.clear();
  }
  return absl::OkStatus();
}

absl::Status ParameterServer::ApplyChunkLocked(int64_t global_chunk) {
  const int64_t start_ns = EventStartNanos();
  // Every worker has pushed this chunk, so every worker's sample count for
  // the iteration is known.
  int64_t samples = 0;
  for (const WorkerState& w : workers_) samples += w.num_samples;
  const int64_t offset = chunk_offset_[global_chunk];
  const int64_t length = static_cast<int64_t>(chunk_params_[global_chunk]->size());
  if (samples > 0) {
    PS_RETURN_IF_ERROR(optimizer_->ApplyRange(
        version_, samples, offset, absl::MakeConstSpan(grad_sum_).subspan(offset, length),
        absl::MakeSpan(MutableChunkLocked(global_chunk))));
  }
  chunk_version_[global_chunk] = version_ + 1;
  chunk_pushes_[global_chunk] = 0;
  ranks_summed_[global_chunk] = 0;
  ReportEvent(EventKind::kServerUpdate, kServerUpdateLane, version_,
              signature_[chunk_key_[global_chunk]].name,
              length * static_cast<int64_t>(sizeof(float)), start_ns);
  if (++chunks_applied_ < total_chunks_) return absl::OkStatus();
  // The iteration's last chunk: every worker's pushes are all in.
  chunks_applied_ = 0;
  for (WorkerState& w : workers_) {
    std::fill(w.pushed.begin(), w.pushed.end(), false);
    w.num_samples = -1;
  }
  ++version_;
  return absl::OkStatus();
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
        signature_.empty() ? "not known (no worker has registered)"
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

int64_t ParameterServer::OldestChunkVersionLocked(absl::Span<const int64_t> global_chunks) const {
  if (global_chunks.empty()) return version_;
  int64_t oldest = chunk_version_[global_chunks[0]];
  for (const int64_t gc : global_chunks) oldest = std::min(oldest, chunk_version_[gc]);
  return oldest;
}

absl::StatusOr<std::vector<int64_t>> ParameterServer::AwaitChunksLocked(
    int64_t version, absl::Time deadline, absl::Span<const ChunkId> chunks) {
  // A chunk that does not exist is refused before any wait; without a
  // signature no chunk is known yet, so it is checked after the wait for
  // version 0 (which needs the signature).
  auto check = [this, chunks]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
    for (const ChunkId& chunk : chunks) {
      int64_t offset, length;
      PS_RETURN_IF_ERROR(CheckKeyChunkLocked(chunk.key, chunk.chunk, &offset, &length));
    }
    return absl::OkStatus();
  };
  if (!signature_.empty()) PS_RETURN_IF_ERROR(check());
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
            "version ", version, " of chunk ", chunk.chunk, " of '", signature_[chunk.key].name,
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
  absl::MutexLock lock(&mu_);
  PS_ASSIGN_OR_RETURN(std::vector<int64_t> global_chunks,
                      AwaitChunksLocked(version, deadline, ids));
  const int64_t start_ns = EventStartNanos();
  for (size_t c = 0; c < chunks.size(); ++c) {
    const std::vector<float>& params = *chunk_params_[global_chunks[c]];
    if (chunks[c].out.size() != params.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk ", chunks[c].chunk, " of '", signature_[chunks[c].key].name, "' has ",
          params.size(), " elements, buffer ", chunks[c].out.size()));
    }
  }
  int64_t elements = 0;
  for (size_t c = 0; c < chunks.size(); ++c) {
    const std::vector<float>& params = *chunk_params_[global_chunks[c]];
    std::memcpy(chunks[c].out.data(), params.data(), params.size() * sizeof(float));
    elements += static_cast<int64_t>(params.size());
  }
  const int64_t pulled = OldestChunkVersionLocked(global_chunks);
  ReportEvent(EventKind::kServerPull, kServerPullLane, pulled,
              chunks.empty() ? absl::string_view() : signature_[chunks[0].key].name,
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
  absl::MutexLock lock(&mu_);
  PS_RETURN_IF_ERROR(AwaitVersionLocked(version, deadline));
  const int64_t start_ns = EventStartNanos();
  if (static_cast<int64_t>(out.size()) != num_parameters_) {
    return absl::InvalidArgumentError(absl::StrCat("pull into ", out.size(),
                                                   " elements; the model has ", num_parameters_));
  }
  for (int64_t gc = 0; gc < total_chunks_; ++gc) {
    const std::vector<float>& params = *chunk_params_[gc];
    std::memcpy(out.data() + chunk_offset_[gc], params.data(), params.size() * sizeof(float));
  }
  ReportEvent(EventKind::kServerPull, kServerPullLane, version_,
              signature_.empty() ? absl::string_view() : signature_[0].name,
              num_parameters_ * static_cast<int64_t>(sizeof(float)), start_ns);
  return version_;
}

absl::StatusOr<ParameterServer::ChunkViews> ParameterServer::PullChunkViews(
    int64_t version, absl::Time deadline, absl::Span<const ChunkId> chunks) {
  absl::MutexLock lock(&mu_);
  PS_ASSIGN_OR_RETURN(std::vector<int64_t> global_chunks,
                      AwaitChunksLocked(version, deadline, chunks));
  const int64_t start_ns = EventStartNanos();
  // The views keep exactly the chunks they view alive: an update of any
  // other chunk writes in place.
  auto held = std::make_shared<std::vector<std::shared_ptr<const std::vector<float>>>>();
  held->reserve(chunks.size());
  ChunkViews views;
  views.version = OldestChunkVersionLocked(global_chunks);
  views.chunks.reserve(chunks.size());
  int64_t elements = 0;
  for (const int64_t gc : global_chunks) {
    const std::shared_ptr<std::vector<float>>& params = chunk_params_[gc];
    views.chunks.push_back(absl::MakeConstSpan(*params));
    held->push_back(params);
    elements += static_cast<int64_t>(params->size());
  }
  views.keep_alive = std::move(held);
  ReportEvent(EventKind::kServerPull, kServerPullLane, views.version,
              chunks.empty() ? absl::string_view() : signature_[chunks[0].key].name,
              elements * static_cast<int64_t>(sizeof(float)), start_ns);
  return views;
}

bool ParameterServer::HasChunks(int64_t version, absl::Span<const ChunkId> chunks) const {
  absl::MutexLock lock(&mu_);
  if (!signature_.empty()) {
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

std::vector<float>& ParameterServer::MutableChunkLocked(int64_t global_chunk) {
  // Views are taken only under mu_, so a count of one (ours) cannot grow
  // while we write. The acquire fence pairs with the release in the last
  // holder's decrement: its reads of the old values happen before our writes.
  std::shared_ptr<std::vector<float>>& params = chunk_params_[global_chunk];
  if (params.use_count() > 1) {
    params = std::make_shared<std::vector<float>>(*params);
  }
  std::atomic_thread_fence(std::memory_order_acquire);
  return *params;
}

std::vector<ParamSpec> ParameterServer::signature() const {
  absl::MutexLock lock(&mu_);
  return signature_;
}

int64_t ParameterServer::version() const {
  absl::MutexLock lock(&mu_);
  return version_;
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

int64_t ParameterServer::held_elements() const {
  absl::MutexLock lock(&mu_);
  return early_elements_;
}

bool ParameterServer::initialized() const {
  absl::MutexLock lock(&mu_);
  return initialized_;
}

int64_t ParameterServer::num_parameters() const {
  absl::MutexLock lock(&mu_);
  return num_parameters_;
}

int64_t ParameterServer::ChunkLength(int key, int64_t chunk) const {
  absl::MutexLock lock(&mu_);
  int64_t offset, length;
  if (!CheckKeyChunkLocked(key, chunk, &offset, &length).ok()) return -1;
  return length;
}

int64_t ParameterServer::NumChunks(int key) const {
  absl::MutexLock lock(&mu_);
  if (key < 0 || key >= static_cast<int>(signature_.size())) return 0;
  return ChunkCount(NumElements(signature_[key].shape), options_.chunk_elements);
}

}  // namespace ps::server
