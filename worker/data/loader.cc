#include "worker/data/loader.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/data/cifar10_reader.h"
#include "worker/data/idx_reader.h"
#include "common/rng.h"
#include "worker/data/synthetic.h"

namespace ps::worker::data {
namespace {

constexpr int64_t kSyntheticTrainSize = 8192;
constexpr int64_t kSyntheticTestSize = 2048;
// Test samples come from far along the task's stream: disjoint from train.
constexpr int64_t kSyntheticTestFirstIndex = int64_t{1} << 40;

// dst[p] = src[p] * a + b. Blocks of a fixed 16 let the compiler vectorise
// the body at -O2 (uint8 -> float conversion, multiply, add) with no
// epilogue inside the block.
void ConvertPixels(const uint8_t* __restrict src, float* __restrict dst, int64_t n, float a,
                   float b) {
  constexpr int kBlock = 16;
  int64_t p = 0;
  for (; p + kBlock <= n; p += kBlock) {
    for (int k = 0; k < kBlock; ++k) dst[p + k] = static_cast<float>(src[p + k]) * a + b;
  }
  for (; p < n; ++p) dst[p] = static_cast<float>(src[p]) * a + b;
}

}  // namespace

std::vector<int64_t> EpochOrder(int64_t size, uint64_t seed, int64_t epoch, bool shuffle) {
  if (size <= 0) return {};
  std::vector<int64_t> order(size);
  for (int64_t i = 0; i < size; ++i) order[i] = i;
  if (!shuffle) return order;
  SplitMix64 rng(MixSeed(seed, static_cast<uint64_t>(epoch)));
  // Fisher-Yates: position i takes a uniform pick of the i + 1 not yet placed.
  for (int64_t i = size - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(rng.Below(static_cast<uint64_t>(i) + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

absl::Status GatherBatch(const Dataset& dataset, absl::Span<const int64_t> indices,
                         const Normalization& normalization, absl::Span<float> images_out,
                         absl::Span<int32_t> labels_out) {
  if (absl::Status layout = ValidateDatasetLayout(dataset); !layout.ok()) {
    return absl::FailedPreconditionError(layout.message());
  }
  const int64_t per_sample = dataset.sample_elements();
  const int64_t n = static_cast<int64_t>(indices.size());
  const int64_t floats = static_cast<int64_t>(images_out.size());
  if (floats % per_sample != 0 || floats / per_sample != n ||
      static_cast<int64_t>(labels_out.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GatherBatch of ", n, " samples of shape ", ShapeToString(dataset.sample_shape), " needs ",
        per_sample, " image floats per sample and ", n, " labels; got ", floats, " and ",
        labels_out.size()));
  }
  const int64_t channels = dataset.sample_shape[0];
  const std::vector<float>& mean = normalization.mean;
  const std::vector<float>& stddev = normalization.std;
  if ((!mean.empty() && static_cast<int64_t>(mean.size()) != channels) ||
      (!stddev.empty() && static_cast<int64_t>(stddev.size()) != channels)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "normalization has ", mean.size(), " means and ", stddev.size(), " stds for ", channels,
        " channels of dataset '", dataset.name, "': each must be empty or one per channel"));
  }
  if (!std::isfinite(normalization.scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat("normalization scale ", normalization.scale, " is not finite"));
  }
  // Per channel, x * a + b == (x * scale - mean) / std.
  absl::InlinedVector<float, 4> a(channels, normalization.scale);
  absl::InlinedVector<float, 4> b(channels, 0.0f);
  for (int64_t c = 0; c < channels; ++c) {
    const float m = mean.empty() ? 0.0f : mean[c];
    const float s = stddev.empty() ? 1.0f : stddev[c];
    if (!std::isfinite(m) || !std::isfinite(s) || !(s > 0.0f)) {
      return absl::InvalidArgumentError(absl::StrCat("normalization of channel ", c, ": mean ", m,
                                                     ", std ", s, " (must be finite, std > 0)"));
    }
    a[c] = normalization.scale / s;
    b[c] = -m / s;
    if (!std::isfinite(a[c]) || !std::isfinite(b[c])) {
      return absl::InvalidArgumentError(absl::StrCat("normalization of channel ", c, ": scale ",
                                                     normalization.scale, ", mean ", m, ", std ", s,
                                                     " overflow a float"));
    }
  }
  // Step 1: check every index, so that nothing is written on error.
  for (int64_t i = 0; i < n; ++i) {
    if (indices[i] < 0 || indices[i] >= dataset.size()) {
      return absl::OutOfRangeError(absl::StrCat("index ", indices[i], " at position ", i,
                                                " of the batch is outside dataset '", dataset.name,
                                                "' of ", dataset.size(), " samples"));
    }
  }
  // Step 2: copy and convert.
  const int64_t plane = per_sample / channels;
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* src = dataset.sample(indices[i]);
    float* dst = images_out.data() + i * per_sample;
    for (int64_t c = 0; c < channels; ++c) {
      ConvertPixels(src + c * plane, dst + c * plane, plane, a[c], b[c]);
    }
    labels_out[i] = dataset.labels[indices[i]];
  }
  return absl::OkStatus();
}

absl::StatusOr<Normalization> ComputeNormalization(const Dataset& dataset, float scale) {
  PS_RETURN_IF_ERROR(ValidateDataset(dataset));
  if (dataset.size() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot compute the statistics of empty dataset '", dataset.name, "'"));
  }
  const int64_t channels = dataset.sample_shape[0];
  const int64_t plane = dataset.sample_elements() / channels;
  // A histogram per channel: exact, and one increment per pixel.
  std::vector<int64_t> counts(channels * 256, 0);
  for (int64_t i = 0; i < dataset.size(); ++i) {
    const uint8_t* sample = dataset.sample(i);
    for (int64_t c = 0; c < channels; ++c) {
      int64_t* histogram = counts.data() + c * 256;
      const uint8_t* src = sample + c * plane;
      for (int64_t p = 0; p < plane; ++p) ++histogram[src[p]];
    }
  }
  Normalization normalization;
  normalization.scale = scale;
  const double total = static_cast<double>(dataset.size()) * static_cast<double>(plane);
  for (int64_t c = 0; c < channels; ++c) {
    double sum = 0.0, sum_squares = 0.0;
    for (int v = 0; v < 256; ++v) {
      const double count = static_cast<double>(counts[c * 256 + v]);
      sum += count * v;
      sum_squares += count * v * v;
    }
    const double mean = sum / total;
    const double variance = std::max(0.0, sum_squares / total - mean * mean);
    const double stddev = std::sqrt(variance) * std::abs(scale);
    normalization.mean.push_back(static_cast<float>(mean * scale));
    normalization.std.push_back(stddev > 0.0 ? static_cast<float>(stddev) : 1.0f);
  }
  return normalization;
}

absl::StatusOr<Dataset> LoadDataset(const std::string& name, const std::string& dir,
                                    const std::string& split) {
  if (name == "fashion_mnist" || name == "mnist") return LoadMnistLike(dir, split, name);
  if (name == "cifar10") return LoadCifar10(dir, split);
  if (name == "synthetic") {
    SyntheticOptions options;
    if (split == "train") {
      options.size = kSyntheticTrainSize;
    } else if (split == "test") {
      options.size = kSyntheticTestSize;
      options.first_index = kSyntheticTestFirstIndex;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown split '", split, "' for synthetic: expected train or test"));
    }
    return MakeSyntheticDataset(options);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown dataset '", name, "': known datasets are cifar10, fashion_mnist, mnist, synthetic"));
}

namespace {

// The samples SplitHoldout(all, fraction, seed) holds out, as a mask.
absl::StatusOr<std::vector<bool>> HoldoutMask(const Dataset& all, double fraction,
                                              uint64_t seed) {
  if (!(fraction >= 0) || fraction >= 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("validation fraction ", fraction, " is not in [0, 1)"));
  }
  const int64_t n = all.size();
  const int64_t held = static_cast<int64_t>(std::llround(fraction * static_cast<double>(n)));
  if (held >= n) {
    return absl::InvalidArgumentError(absl::StrCat("a validation fraction of ", fraction, " of ",
                                                   n, " samples leaves none to train on"));
  }
  // A permutation of its own stream of the seed: not an epoch's order.
  std::vector<int64_t> order = EpochOrder(n, MixSeed(seed, 0x7a11d47a5e7ULL), 0, true);
  std::vector<bool> validation(n, false);
  for (int64_t i = 0; i < held; ++i) validation[order[i]] = true;
  return validation;
}

HoldoutSplit EmptySplitLike(const Dataset& all) {
  HoldoutSplit split;
  for (Dataset* d : {&split.train, &split.validation}) {
    d->name = all.name;
    d->sample_shape = all.sample_shape;
    d->num_classes = all.num_classes;
  }
  split.validation.name = absl::StrCat(all.name, " (validation)");
  return split;
}

}  // namespace

absl::StatusOr<HoldoutSplit> SplitHoldout(const Dataset& all, double fraction, uint64_t seed) {
  PS_ASSIGN_OR_RETURN(const std::vector<bool> validation, HoldoutMask(all, fraction, seed));
  const int64_t n = all.size();
  const int64_t held = std::count(validation.begin(), validation.end(), true);
  HoldoutSplit split = EmptySplitLike(all);
  const int64_t bytes = all.sample_elements();
  split.validation.pixels.reserve(held * bytes);
  split.train.pixels.reserve((n - held) * bytes);
  for (int64_t i = 0; i < n; ++i) {
    Dataset& to = validation[i] ? split.validation : split.train;
    to.pixels.insert(to.pixels.end(), all.sample(i), all.sample(i) + bytes);
    to.labels.push_back(all.labels[i]);
  }
  return split;
}

absl::StatusOr<HoldoutSplit> SplitHoldout(Dataset&& all, double fraction, uint64_t seed) {
  PS_ASSIGN_OR_RETURN(const std::vector<bool> validation, HoldoutMask(all, fraction, seed));
  const int64_t n = all.size();
  const int64_t held = std::count(validation.begin(), validation.end(), true);
  HoldoutSplit split = EmptySplitLike(all);
  const int64_t bytes = all.sample_elements();
  split.validation.pixels.reserve(held * bytes);
  split.validation.labels.reserve(held);
  // The training samples move forward within `all`'s own buffers (sample i
  // goes to slot kept <= i, so nothing unread is overwritten), in order.
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint8_t* sample = all.pixels.data() + i * bytes;
    if (validation[i]) {
      split.validation.pixels.insert(split.validation.pixels.end(), sample, sample + bytes);
      split.validation.labels.push_back(all.labels[i]);
      continue;
    }
    if (kept != i) {
      std::memmove(all.pixels.data() + kept * bytes, sample, bytes);
      all.labels[kept] = all.labels[i];
    }
    ++kept;
  }
  all.pixels.resize(kept * bytes);
  all.labels.resize(kept);
  split.train.pixels = std::move(all.pixels);
  split.train.labels = std::move(all.labels);
  return split;
}

}  // namespace ps::worker::data
