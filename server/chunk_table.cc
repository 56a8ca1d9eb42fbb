#include "server/chunk_table.h"

#include <algorithm>
#include <utility>

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ps::server {

absl::StatusOr<std::unique_ptr<ChunkTable>> ChunkTable::Create(
    const std::vector<ParamSpec>& signature, int64_t chunk_elements, int64_t max_parameters,
    const std::vector<NamedTensor>& initial, int num_workers, int64_t window,
    CpuDevice* device) {
  PS_ASSIGN_OR_RETURN(ChunkLayout layout,
                      ChunkLayout::Make(signature, chunk_elements, max_parameters));
  // What the table allocates per element (the parameters, each iteration
  // slot's sum) and the optimizer's momentum, against the machine's memory:
  // a model that can never fit is refused with its sizes, not met by the
  // out-of-memory killer halfway through zero-filling it.
  const int64_t total = layout.num_parameters;
  const int64_t physical_bytes =
      static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  const int64_t needed_bytes = total * static_cast<int64_t>(sizeof(float)) * (2 + window);
  if (physical_bytes > 0 && needed_bytes > physical_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the model's ", total, " parameters need at least ", needed_bytes >> 20,
        " MiB on this server (parameters, momentum and ", window,
        " iteration sums); this machine has ", physical_bytes >> 20, " MiB"));
  }
  std::vector<float> values;
  if (!initial.empty()) {
    PS_ASSIGN_OR_RETURN(values, LayOut(initial, layout));
  }
  return std::make_unique<ChunkTable>(std::move(layout), num_workers, window, values, device);
}

ChunkTable::ChunkTable(ChunkLayout layout, int num_workers, int64_t window,
                       const std::vector<float>& initial, CpuDevice* device)
    : layout_(std::move(layout)),
      num_workers_(num_workers),
      window_(window),
      device_(device),
      chunks_(std::make_unique<Chunk[]>(layout_.total_chunks)) {
  for (int64_t gc = 0; gc < layout_.total_chunks; ++gc) {
    const int64_t offset = layout_.chunk_offset[gc], length = layout_.chunk_length[gc];
    Chunk& chunk = chunks_[gc];
    // Nobody else sees the table yet; the lock is for the annotations.
    absl::MutexLock lock(&chunk.mu);
    // One buffer per chunk, cut from the flat values.
    chunk.buffers = ChunkBuffers(initial.empty() ? std::vector<float>(length, 0.f)
                                                 : std::vector<float>(initial.begin() + offset,
                                                                      initial.begin() + offset +
                                                                          length));
    chunk.slots.resize(window_);
    for (Aggregation& agg : chunk.slots) agg.sum.Reset(length, num_workers_);
    chunk.waived.assign(num_workers_, false);
  }
}

const std::string& ChunkTable::name(int64_t gc) const {
  return layout_.signature[layout_.chunk_key[gc]].name;
}

void ChunkTable::SumLocked(int rank, Chunk& chunk, Aggregation& agg, F32Pieces part) {
  if (agg.overflow) return;  // the update will be skipped: nothing to sum
  held_elements_ += agg.sum.Add(rank, part, chunk.waived);
}

ChunkTable::Added ChunkTable::Add(int64_t gc, int64_t iteration, int rank, F32Pieces part,
                                  int64_t num_samples, bool overflow) {
  Chunk& chunk = chunks_[gc];
  absl::MutexLock lock(&chunk.mu);
  Aggregation& agg = SlotLocked(chunk, iteration);
  if (overflow) agg.overflow = true;
  Added added;
  added.completes = ++agg.pushes + chunk.waived_count == num_workers_;
  added.last_term_pending =
      added.completes && !agg.overflow && agg.sum.IsLastTerm(rank, part, chunk.waived);
  if (!added.last_term_pending) SumLocked(rank, chunk, agg, part);
  agg.samples += num_samples;
  return added;
}

void ChunkTable::AddLastTerm(int64_t gc, int64_t iteration, int rank, F32Pieces part) {
  Chunk& chunk = chunks_[gc];
  absl::MutexLock lock(&chunk.mu);
  SumLocked(rank, chunk, SlotLocked(chunk, iteration), part);
}

bool ChunkTable::Waive(int64_t gc, int64_t iteration, int rank) {
  Chunk& chunk = chunks_[gc];
  absl::MutexLock lock(&chunk.mu);
  if (chunk.version != iteration || chunk.waived[rank]) return false;
  chunk.waived[rank] = true;
  ++chunk.waived_count;
  Aggregation& agg = SlotLocked(chunk, iteration);
  held_elements_ -= agg.sum.SumHeldInTurn(chunk.waived);
  return agg.pushes + chunk.waived_count == num_workers_;
}

std::vector<int64_t> ChunkTable::WaiveEach(absl::Span<const int64_t> gcs, int64_t iteration,
                                           int rank) {
  std::vector<int64_t> complete;
  for (const int64_t gc : gcs) {
    if (Waive(gc, iteration, rank)) complete.push_back(gc);
  }
  return complete;
}

void ChunkTable::WaiveAbsent(const std::vector<bool>& participating) {
  int waived = 0;
  for (bool p : participating) waived += !p;
  for (int64_t gc = 0; gc < layout_.total_chunks; ++gc) {
    Chunk& chunk = chunks_[gc];
    absl::MutexLock lock(&chunk.mu);
    for (size_t r = 0; r < participating.size(); ++r) chunk.waived[r] = !participating[r];
    chunk.waived_count = waived;
  }
}

absl::StatusOr<bool> ChunkTable::Apply(int64_t gc, int64_t iteration, float loss_scale,
                                       const F32Pieces* last_term, Optimizer& optimizer) {
  Chunk& chunk = chunks_[gc];
  absl::MutexLock lock(&chunk.mu);
  Aggregation& agg = SlotLocked(chunk, iteration);
  const bool skipped = agg.overflow;
  if (agg.overflow) {
    // The parameters stay, and the parts held for their turn are dropped.
    chunk.buffers.PublishUnchanged();
    held_elements_ -= agg.sum.DropHeld();
    agg.overflow = false;
  } else if (agg.samples > 0) {
    // Every member has pushed this chunk, so `samples` covers all of them.
    absl::MutexLockMaybe device_lock(device_->num_threads() > 1 ? &device_mu_ : nullptr);
    // Into the next buffer, keeping these parameters as the previous ones.
    std::shared_ptr<std::vector<float>> next = chunk.buffers.NextBuffer();
    const float scale = loss_scale > 0 ? loss_scale : 1.f;
    const int64_t offset = layout_.chunk_offset[gc];
    if (last_term != nullptr) {
      PS_RETURN_IF_ERROR(optimizer.ApplyRangeAdding(
          iteration, agg.samples, offset,
          agg.sum.started() ? agg.sum.values() : absl::Span<const float>(), *last_term,
          *chunk.buffers.current(), absl::MakeSpan(*next), scale));
    } else {
      PS_RETURN_IF_ERROR(optimizer.ApplyRange(iteration, agg.samples, offset, agg.sum.values(),
                                              *chunk.buffers.current(), absl::MakeSpan(*next),
                                              scale));
    }
    chunk.buffers.Publish(std::move(next));
  } else if (optimizer.output() == Optimizer::Output::kParameters) {
    // No samples: the parameters stay; version - 1's are the same.
    chunk.buffers.PublishUnchanged();
  } else {
    // No samples under a mean-gradient optimizer: a zero gradient, not the
    // previous iteration's again.
    std::shared_ptr<std::vector<float>> next = chunk.buffers.NextBuffer();
    std::fill(next->begin(), next->end(), 0.f);
    chunk.buffers.Publish(std::move(next));
  }
  chunk.version = iteration + 1;
  agg.pushes = 0;
  agg.sum.Restart();
  agg.samples = 0;
  return skipped;
}

absl::StatusOr<ChunkTable::Applied> ChunkTable::ApplyNow(int64_t gc, int64_t based_on_version,
                                                         int64_t num_samples, int num_workers,
                                                         F32Pieces gradient,
                                                         Optimizer& optimizer) {
  Chunk& chunk = chunks_[gc];
  absl::MutexLock lock(&chunk.mu);
  Applied applied;
  applied.staleness = std::max<int64_t>(0, chunk.version - based_on_version);
  if (num_samples > 0 && layout_.chunk_length[gc] > 0) {
    std::vector<float>& grad = chunk.slots[0].sum.mutable_values();
    AssignPiecesTo(gradient, grad.data());
    std::shared_ptr<std::vector<float>> next = chunk.buffers.NextBuffer();
    absl::MutexLockMaybe device_lock(device_->num_threads() > 1 ? &device_mu_ : nullptr);
    PS_RETURN_IF_ERROR(optimizer.ApplyRange(chunk.version / num_workers, num_samples,
                                            layout_.chunk_offset[gc], grad,
                                            *chunk.buffers.current(), absl::MakeSpan(*next)));
    chunk.buffers.Publish(std::move(next));
  }
  applied.version = ++chunk.version;
  return applied;
}

void ChunkTable::Initialize(int64_t gc, F32Pieces values) {
  Chunk& chunk = chunks_[gc];
  absl::MutexLock lock(&chunk.mu);
  CopyPiecesTo(values, chunk.buffers.MutableCurrent().data());
}

void ChunkTable::SetVersion(int64_t version) {
  for (int64_t gc = 0; gc < layout_.total_chunks; ++gc) {
    absl::MutexLock lock(&chunks_[gc].mu);
    chunks_[gc].version = version;
  }
}

absl::StatusOr<ChunkTable::View> ChunkTable::Take(int64_t gc, int64_t version, bool exact,
                                                  bool with_previous) const {
  const Chunk& chunk = chunks_[gc];
  absl::MutexLock lock(&chunk.mu);
  View view;
  view.version = chunk.version;
  view.params = chunk.buffers.current();
  const std::shared_ptr<std::vector<float>>& previous = chunk.buffers.previous();
  if (exact && chunk.version != version) {
    if (chunk.version != version + 1 || previous == nullptr) {
      const int key = layout_.chunk_key[gc];
      return absl::FailedPreconditionError(
          absl::StrCat("version ", version, " of chunk ", gc - layout_.key_first_chunk[key],
                       " of '", name(gc), "' is gone: the chunk is at version ", chunk.version));
    }
    view.params = previous;
    view.version = version;
  }
  // `previous` is version - 1 exactly when the chunk is at `version` (the
  // no-sample and skipped updates keep the same buffer: no change).
  if (with_previous && chunk.version == version) view.previous = previous;
  return view;
}

absl::StatusOr<ChunkTable::Views> ChunkTable::TakeAll(absl::Span<const int64_t> gcs,
                                                      int64_t version, bool exact,
                                                      bool with_previous) const {
  Views views;
  views.version = version;
  auto held = std::make_shared<std::vector<std::shared_ptr<const std::vector<float>>>>();
  held->reserve(gcs.size());
  views.chunks.reserve(gcs.size());
  for (size_t c = 0; c < gcs.size(); ++c) {
    PS_ASSIGN_OR_RETURN(View view, Take(gcs[c], version, exact, with_previous));
    views.chunks.push_back(absl::MakeConstSpan(*view.params));
    views.bytes += static_cast<int64_t>(view.params->size() * sizeof(float));
    held->push_back(std::move(view.params));
    if (with_previous) {
      views.previous.push_back(view.previous != nullptr ? absl::MakeConstSpan(*view.previous)
                                                        : absl::Span<const float>());
      if (view.previous != nullptr) held->push_back(std::move(view.previous));
    }
    views.version = c == 0 ? view.version : std::min(views.version, view.version);
  }
  views.keep_alive = std::move(held);
  return views;
}

void ChunkTable::CopyAll(absl::Span<float> out) const {
  for (int64_t gc = 0; gc < layout_.total_chunks; ++gc) {
    const Chunk& chunk = chunks_[gc];
    absl::MutexLock lock(&chunk.mu);
    const std::vector<float>& params = *chunk.buffers.current();
    std::copy(params.begin(), params.end(), out.begin() + layout_.chunk_offset[gc]);
  }
}

}  // namespace ps::server
