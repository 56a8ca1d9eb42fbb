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
  PS_ASSIGN_OR_RETURN(store->server_, server::ParameterServer::Create(options, {}, {},
                                                                      store->device_.get()));
  return store;
}

absl::StatusOr<ParameterStore::Registration> LocalParameterStore::Register(
    const std::vector<ParamSpec>& signature, absl::Span<const float> proposed) {
  PS_ASSIGN_OR_RETURN(server::ParameterServer::Registration reg,
                      server_->Register("local", signature, proposed));
  signature_ = signature;
  rank_ = reg.rank;
  Registration out;
  out.rank = reg.rank;
  out.num_workers = reg.num_workers;
  out.version = reg.version;
  return out;
}

absl::Status LocalParameterStore::Push(int64_t iteration, int64_t num_samples,
                                       absl::Span<const float> gradient) {
  // One chunk per key, all pushed at once: all or nothing, as a message is.
  std::vector<server::ParameterServer::ChunkData> chunks;
  chunks.reserve(signature_.size());
  int64_t offset = 0;
  for (int key = 0; key < static_cast<int>(signature_.size()); ++key) {
    const int64_t n = NumElements(signature_[key].shape);
    if (offset + n > static_cast<int64_t>(gradient.size())) {
      return absl::InvalidArgumentError(absl::StrCat("gradient of ", gradient.size(),
                                                     " elements is shorter than the model"));
    }
    chunks.push_back({key, /*chunk=*/0, gradient.subspan(offset, n)});
    offset += n;
  }
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

}  // namespace ps::worker
