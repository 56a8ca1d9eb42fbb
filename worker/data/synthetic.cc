#include "worker/data/synthetic.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/rng.h"

namespace ps::worker::data {
namespace {

constexpr int64_t kBlock = 4;  // prototype pixels come in kBlock x kBlock blocks

// Streams of the seed: one for the prototypes, one per sample after it.
constexpr uint64_t kPrototypeStream = 0;

}  // namespace

absl::StatusOr<Dataset> MakeSyntheticDataset(const SyntheticOptions& options) {
  Dataset dataset;
  dataset.name = "synthetic";
  dataset.sample_shape = options.sample_shape;
  dataset.num_classes = options.num_classes;
  if (options.size < 0 || options.first_index < 0) {
    return absl::InvalidArgumentError(absl::StrCat("synthetic dataset: size ", options.size,
                                                   " and first_index ", options.first_index,
                                                   " must be >= 0"));
  }
  if (options.noise < 0 || options.noise > 255) {
    return absl::InvalidArgumentError(
        absl::StrCat("synthetic dataset: noise ", options.noise, " is outside [0, 255]"));
  }
  if (options.num_classes > (1 << 16)) {
    return absl::InvalidArgumentError(absl::StrCat("synthetic dataset: ", options.num_classes,
                                                   " classes, at most 65536 supported"));
  }
  // Checks shape and class count (on an empty dataset: cheap).
  PS_RETURN_IF_ERROR(ValidateDataset(dataset));

  const int64_t channels = options.sample_shape[0];
  const int64_t height = options.sample_shape[1];
  const int64_t width = options.sample_shape[2];
  const int64_t per_sample = dataset.sample_elements();
  if (options.size > 0 && per_sample > (int64_t{1} << 40) / options.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("synthetic dataset: ", options.size, " samples of ",
                     ShapeToString(options.sample_shape), " exceed 2^40 bytes"));
  }

  // Step 1: one prototype per class, blockwise constant.
  SplitMix64 prototype_rng(MixSeed(options.seed, kPrototypeStream));
  const int64_t block_rows = (height + kBlock - 1) / kBlock;
  const int64_t block_cols = (width + kBlock - 1) / kBlock;
  std::vector<int> prototypes(options.num_classes * per_sample);
  std::vector<int> blocks(block_rows * block_cols);
  for (int64_t k = 0; k < options.num_classes; ++k) {
    for (int64_t c = 0; c < channels; ++c) {
      for (int& b : blocks) b = static_cast<int>(prototype_rng.Below(256));
      int* plane = prototypes.data() + (k * channels + c) * height * width;
      for (int64_t y = 0; y < height; ++y) {
        for (int64_t x = 0; x < width; ++x) {
          plane[y * width + x] = blocks[(y / kBlock) * block_cols + x / kBlock];
        }
      }
    }
  }

  // Step 2: each sample from its own stream: a label, then the noise.
  dataset.labels.resize(options.size);
  dataset.pixels.resize(options.size * per_sample);
  const uint64_t noise_span = 2 * static_cast<uint64_t>(options.noise) + 1;
  for (int64_t i = 0; i < options.size; ++i) {
    // +1: stream 0 is the prototypes'.
    SplitMix64 rng(MixSeed(options.seed, static_cast<uint64_t>(options.first_index + i) + 1));
    const int64_t label = static_cast<int64_t>(rng.Below(options.num_classes));
    dataset.labels[i] = static_cast<int32_t>(label);
    const int* prototype = prototypes.data() + label * per_sample;
    uint8_t* out = dataset.pixels.data() + i * per_sample;
    // Two 32-bit draws per Next(), scaled to [0, noise_span) by a multiply
    // (Lemire's method; its bias of < 2^-24 is immaterial for noise).
    uint64_t bits = 0;
    for (int64_t p = 0; p < per_sample; ++p) {
      if ((p & 1) == 0) bits = rng.Next();
      const uint64_t draw = (p & 1) == 0 ? (bits & 0xffffffffu) : (bits >> 32);
      const int noise = static_cast<int>((draw * noise_span) >> 32) - options.noise;
      out[p] = static_cast<uint8_t>(std::clamp(prototype[p] + noise, 0, 255));
    }
  }
  return dataset;
}

}  // namespace ps::worker::data
