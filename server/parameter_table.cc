#include "server/parameter_table.h"

#include <algorithm>
#include <atomic>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ps::server {
namespace {

// A bound as people write it: 2^40 rather than 1099511627776.
std::string BoundText(int64_t bound) {
  for (int k = 1; k < 63; ++k) {
    if (bound == int64_t{1} << k) return absl::StrCat("2^", k);
  }
  return absl::StrCat(bound);
}

}  // namespace

absl::StatusOr<ChunkLayout> ChunkLayout::Make(const std::vector<ParamSpec>& signature,
                                              int64_t chunk_elements, int64_t max_parameters) {
  if (signature.empty()) return absl::InvalidArgumentError("the signature is empty");
  ChunkLayout layout;
  int64_t total = 0, chunks = 0;
  for (const ParamSpec& spec : signature) {
    if (spec.dtype != DType::kF32) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", spec.name, "' is ",
                                                     DTypeName(spec.dtype),
                                                     "; the server stores F32 only"));
    }
    // Multiplied with overflow checked, and the whole bounded, before
    // anything is allocated.
    int64_t n = 0;
    if (!CheckedNumElements(spec.shape, &n) || n >= max_parameters) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter '", spec.name, "' has shape ", ShapeToString(spec.shape),
          ": a negative dimension, or ", BoundText(max_parameters), " elements or more"));
    }
    layout.key_offset.push_back(total);
    layout.key_first_chunk.push_back(chunks);
    total += n;  // each term below max_parameters: no overflow before the check
    if (total >= max_parameters) {
      return absl::InvalidArgumentError(
          absl::StrCat("the model has ", BoundText(max_parameters), " parameters or more"));
    }
    chunks += ChunkCount(n, chunk_elements);
  }
  layout.signature = signature;
  layout.chunk_elements = chunk_elements;
  layout.total_chunks = chunks;
  layout.num_parameters = total;
  layout.chunk_key.reserve(chunks);
  layout.chunk_offset.reserve(chunks);
  layout.chunk_length.reserve(chunks);
  for (size_t key = 0; key < signature.size(); ++key) {
    const int64_t n = NumElements(signature[key].shape);
    for (int64_t begin = 0, c = 0; c < ChunkCount(n, chunk_elements);
         ++c, begin += chunk_elements) {
      layout.chunk_key.push_back(static_cast<int>(key));
      layout.chunk_offset.push_back(layout.key_offset[key] + begin);
      layout.chunk_length.push_back(std::min(chunk_elements, n - begin));
    }
  }
  return layout;
}

int64_t ChunkLayout::GlobalChunk(int key, int64_t chunk) const {
  if (key < 0 || key >= static_cast<int>(signature.size())) return -1;
  const int64_t first = key_first_chunk[key];
  const int64_t end =
      key + 1 < static_cast<int>(signature.size()) ? key_first_chunk[key + 1] : total_chunks;
  if (chunk < 0 || chunk >= end - first) return -1;
  return first + chunk;
}

absl::StatusOr<int64_t> ChunkLayout::FindChunk(int key, int64_t chunk) const {
  if (key < 0 || key >= static_cast<int>(signature.size())) {
    return absl::OutOfRangeError(
        absl::StrCat("key ", key, " out of range: the model has ", signature.size(), " keys"));
  }
  const int64_t global = GlobalChunk(key, chunk);
  if (global < 0) {
    return absl::OutOfRangeError(
        absl::StrCat("chunk ", chunk, " of key '", signature[key].name, "' out of range: it has ",
                     ChunkCount(NumElements(signature[key].shape), chunk_elements), " chunks"));
  }
  return global;
}

std::vector<float>& ChunkBuffers::MutableCurrent() {
  // A count of one (ours) cannot grow while we write (views are taken under
  // the caller's lock). The acquire fence pairs with the release in the
  // last holder's decrement: its reads of the old values happen before our
  // writes.
  if (current_.use_count() > 1) current_ = std::make_shared<std::vector<float>>(*current_);
  std::atomic_thread_fence(std::memory_order_acquire);
  return *current_;
}

std::shared_ptr<std::vector<float>> ChunkBuffers::NextBuffer() {
  // Reuse the previous parameters' buffer unless a view still holds it.
  // The acquire fence pairs with the last holder's release. The update
  // writes every element (out of place), so nothing is copied.
  std::shared_ptr<std::vector<float>> next;
  if (previous_ != nullptr && previous_.use_count() == 1 && previous_ != current_) {
    next = std::move(previous_);
    std::atomic_thread_fence(std::memory_order_acquire);
  } else {
    previous_.reset();
    next = std::make_shared<std::vector<float>>(current_->size());
  }
  return next;
}

void ChunkBuffers::Publish(std::shared_ptr<std::vector<float>> next) {
  previous_ = std::move(current_);
  current_ = std::move(next);
}

}  // namespace ps::server
