#include "server/initial_values.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ps::server {

absl::Status CheckNamedTensors(const std::vector<NamedTensor>& tensors) {
  for (const NamedTensor& t : tensors) {
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
  return absl::OkStatus();
}

absl::StatusOr<std::vector<NamedTensor>> NameFlatValues(const std::vector<ParamSpec>& signature,
                                                        const std::vector<float>& flat) {
  std::vector<NamedTensor> named;
  int64_t offset = 0;
  for (const ParamSpec& spec : signature) {
    const int64_t n = NumElements(spec.shape);
    if (offset + n > static_cast<int64_t>(flat.size())) {
      return absl::InvalidArgumentError(absl::StrCat("initial parameters have ", flat.size(),
                                                     " elements but the signature needs more"));
    }
    named.push_back({spec.name, spec.shape,
                     std::vector<float>(flat.begin() + offset, flat.begin() + offset + n)});
    offset += n;
  }
  if (offset != static_cast<int64_t>(flat.size())) {
    return absl::InvalidArgumentError(absl::StrCat("initial parameters have ", flat.size(),
                                                   " elements but the signature needs ", offset));
  }
  return named;
}

absl::StatusOr<std::vector<float>> LayOut(const std::vector<NamedTensor>& tensors,
                                          const ChunkLayout& layout) {
  std::vector<float> flat(layout.num_parameters);
  for (size_t key = 0; key < layout.signature.size(); ++key) {
    const ParamSpec& spec = layout.signature[key];
    auto it = std::find_if(tensors.begin(), tensors.end(),
                           [&](const NamedTensor& t) { return t.name == spec.name; });
    if (it == tensors.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the server's initial parameters have no '", spec.name, "', which the worker's model has"));
    }
    if (it->shape != spec.shape) {
      return absl::FailedPreconditionError(absl::StrCat(
          "parameter '", spec.name, "' has shape ", ShapeToString(it->shape),
          " on the server but ", ShapeToString(spec.shape), " on the worker"));
    }
    std::copy(it->values.begin(), it->values.end(), flat.begin() + layout.key_offset[key]);
  }
  return flat;
}

void InitialChunks::Expect(int64_t total_chunks) {
  received_.assign(total_chunks, false);
  count_ = 0;
  complete_ = total_chunks == 0;
}

void InitialChunks::Restart() {
  std::fill(received_.begin(), received_.end(), false);
  count_ = 0;
}

bool InitialChunks::Receive(int64_t global_chunk) {
  received_[global_chunk] = true;
  ++count_;
  if (count_ < static_cast<int64_t>(received_.size())) return false;
  received_.clear();
  complete_ = true;
  return true;
}

absl::StatusOr<std::vector<int64_t>> InitialChunks::Check(
    int rank, const ChunkLayout& layout, absl::Span<const ChunkBytes> chunks) const {
  if (complete_) {
    return absl::FailedPreconditionError("the initial parameters are already complete");
  }
  if (rank != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker rank ", rank, " sent initial parameters; only rank 0 is asked to"));
  }
  std::vector<int64_t> global_chunks;
  const absl::Status shapes =
      CheckChunkShapes(layout, chunks, received_, "sent as an initial value", &global_chunks);
  PS_RETURN_IF_ERROR(CheckChunkValues(layout, chunks, global_chunks.size()));
  PS_RETURN_IF_ERROR(shapes);
  return global_chunks;
}

}  // namespace ps::server
