#include "worker/local_parameter_store.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ps::worker {

absl::StatusOr<std::unique_ptr<LocalParameterStore>> LocalParameterStore::Create(
    const server::OptimizerOptions& optimizer, int optimizer_threads) {
  std::unique_ptr<LocalParameterStore> store(new LocalParameterStore());
  store->device_ = std::make_unique<CpuDevice>(0, optimizer_threads);
  server::ParameterServerOptions options;
  options.num_workers = 1;
  options.optimizer = optimizer;
  // In process nothing bounds a message: one chunk per key.
  options.chunk_elements = std::numeric_limits<int64_t>::max() / 2;
  store->steps_per_epoch_ = optimizer.schedule.steps_per_epoch;
  PS_ASSIGN_OR_RETURN(store->server_,
                      server::ParameterServer::Create(options, store->device_.get()));
  return store;
}

absl::StatusOr<ParameterStore::Registration> LocalParameterStore::Register(
    const std::vector<ParamSpec>& signature, absl::Span<const float> proposed) {
  PS_ASSIGN_OR_RETURN(server::ParameterServer::Registration reg,
                      server_->Register("local", signature, /*requested_rank=*/-1,
                                        steps_per_epoch_));
  signature_ = signature;
  key_ends_.clear();
  int64_t offset = 0;
  for (const ParamSpec& spec : signature_) {
    offset += NumElements(spec.shape);
    key_ends_.push_back(offset);
  }
  rank_ = reg.rank;
  if (reg.send_initial_parameters) {
    PS_ASSIGN_OR_RETURN(std::vector<server::ParameterServer::ChunkData> chunks,
                        ChunkPerKey(proposed));
    PS_RETURN_IF_ERROR(server_->InitializeChunks(rank_, chunks));
  }
  Registration out;
  out.rank = reg.rank;
  out.num_workers = reg.num_workers;
  out.version = reg.version;
  return out;
}

absl::StatusOr<std::vector<server::ParameterServer::ChunkData>> LocalParameterStore::ChunkPerKey(
    absl::Span<const float> flat) const {
  std::vector<server::ParameterServer::ChunkData> chunks;
  chunks.reserve(signature_.size());
  int64_t offset = 0;
  for (int key = 0; key < static_cast<int>(signature_.size()); ++key) {
    const int64_t n = NumElements(signature_[key].shape);
    if (offset + n > static_cast<int64_t>(flat.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("a buffer of ", flat.size(), " elements is shorter than the model"));
    }
    chunks.push_back({key, /*chunk=*/0, flat.subspan(offset, n)});
    offset += n;
  }
  return chunks;
}

absl::Status LocalParameterStore::Push(int64_t iteration, int64_t num_samples,
                                       absl::Span<const float> gradient) {
  // One chunk per key, all pushed at once: all or nothing, as a message is.
  PS_ASSIGN_OR_RETURN(std::vector<server::ParameterServer::ChunkData> chunks,
                      ChunkPerKey(gradient));
  return server_->PushChunks(rank_, iteration, num_samples, chunks);
}

absl::Status LocalParameterStore::WaitForVersion(int64_t version) {
  // With one worker the version exists as soon as its push returns; waiting
  // for any other version would never end, so it is an error.
  if (server_->version() >= version) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "version ", version, " does not exist; the local store is at ", server_->version()));
}

absl::StatusOr<int64_t> LocalParameterStore::Pull(int64_t version, absl::Span<float> params) {
  return server_->Pull(version, absl::Now(), params);
}

std::vector<int64_t> LocalParameterStore::SegmentEnds() const { return key_ends_; }

absl::Status LocalParameterStore::CheckSegments(int first, int last, size_t flat_size) const {
  if (first < 0 || last < first || last > static_cast<int>(signature_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("segments [", first, ", ", last,
                                                   ") out of range: the model has ",
                                                   signature_.size()));
  }
  const int64_t size = key_ends_.empty() ? 0 : key_ends_.back();
  if (static_cast<int64_t>(flat_size) != size) {
    return absl::InvalidArgumentError(
        absl::StrCat("a buffer of ", flat_size, " elements for a model of ", size));
  }
  return absl::OkStatus();
}

void LocalParameterStore::PushSegments(int64_t iteration, int64_t num_samples, int first,
                                       int last, absl::Span<const float> gradient, Done done) {
  absl::Status status = CheckSegments(first, last, gradient.size());
  if (status.ok()) {
    absl::StatusOr<std::vector<server::ParameterServer::ChunkData>> chunks =
        ChunkPerKey(gradient);
    status = chunks.ok() ? server_->PushChunks(rank_, iteration, num_samples,
                                               absl::MakeConstSpan(*chunks).subspan(
                                                   first, last - first))
                         : chunks.status();
  }
  done(status);
}

void LocalParameterStore::PullSegments(int64_t version, int first, int last,
                                       absl::Span<float> params, Done done) {
  if (absl::Status s = CheckSegments(first, last, params.size()); !s.ok()) return done(s);
  std::vector<server::ParameterServer::ChunkOut> outs;
  for (int key = first; key < last; ++key) {
    const int64_t begin = key == 0 ? 0 : key_ends_[key - 1];
    outs.push_back({key, /*chunk=*/0, params.subspan(begin, key_ends_[key] - begin)});
  }
  absl::StatusOr<int64_t> got = server_->PullChunks(version, absl::Now(), outs);
  if (got.ok() && *got != version) {
    got = absl::InternalError(
        absl::StrCat("pulled version ", *got, " where version ", version, " was asked for"));
  }
  done(got.status());
}

}  // namespace ps::worker
