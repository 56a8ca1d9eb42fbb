#ifndef PS_WORKER_DATA_LOADER_H_
#define PS_WORKER_DATA_LOADER_H_

// What the training loop needs from the data layer each epoch and step: a
// sample order that every worker computes identically, and batches gathered
// into float NCHW buffers.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/data/dataset.h"

namespace ps::worker::data {

// The order in which epoch `epoch` visits the samples 0..size-1: the identity
// when !shuffle, else a uniformly random permutation (Fisher-Yates driven by
// SplitMix64, see common/rng.h) that is a pure function of (seed, epoch) and so
// identical on every machine, compiler and standard library. Workers that
// share a seed can each take their own slice of the same order. Empty for
// size <= 0. O(size).
std::vector<int64_t> EpochOrder(int64_t size, uint64_t seed, int64_t epoch, bool shuffle);

// A seeded hold-out split of `all` (a training set): round(fraction * size)
// samples, chosen by a permutation that depends only on `seed` (the same on
// every worker), go to the validation set, the others to the training set,
// each in the order they had in `all`. No sample is in both, and together
// they are all of `all`. fraction 0 gives an empty validation set.
// kInvalidArgument for a fraction outside [0, 1) or one that leaves no
// training sample.
struct HoldoutSplit {
  Dataset train;
  Dataset validation;
};
absl::StatusOr<HoldoutSplit> SplitHoldout(const Dataset& all, double fraction, uint64_t seed);
// The same split, taking `all`'s memory for the training set (its samples
// moved forward in place), so that the dataset is never held twice: the
// peak is `all` plus the validation set. `all` is left empty, unless the
// fraction is refused (then it is unchanged).
absl::StatusOr<HoldoutSplit> SplitHoldout(Dataset&& all, double fraction, uint64_t seed);

// How uint8 pixels become model inputs: x = pixel * scale, then, per channel
// c, (x - mean[c]) / std[c]. mean and std are in units of x (after scaling)
// and each is either empty (mean 0, std 1) or one value per channel.
struct Normalization {
  float scale = 1.0f / 255.0f;
  std::vector<float> mean;
  std::vector<float> std;
};

// Writes samples `indices` of `dataset` (in that order, repeats allowed) into
// `images_out` as floats [indices.size(), C, H, W], normalised as above, and
// their labels into `labels_out` [indices.size()].
//
// The output buffers are the caller's (host memory) and must be exactly that
// size. Nothing is written unless every check passes:
//   kInvalidArgument  wrong output sizes; mean/std neither empty nor one per
//                     channel; a non-finite scale, mean or std, or std <= 0
//   kOutOfRange       an index outside [0, dataset.size())
//   kFailedPrecondition  a dataset that fails ValidateDatasetLayout()
// The arithmetic is x * (scale / std) + (-mean / std), per channel, with no
// per-pixel branches, so results can differ from the formula above by an
// ulp. O(indices.size() * C * H * W); thread-safe (reads `dataset` only).
absl::Status GatherBatch(const Dataset& dataset, absl::Span<const int64_t> indices,
                         const Normalization& normalization, absl::Span<float> images_out,
                         absl::Span<int32_t> labels_out);

// The per-channel mean and (population) standard deviation of pixel * scale
// over the whole dataset, as a Normalization with that scale. A constant
// channel gets std 1, so that it normalises to 0. kInvalidArgument for an
// empty or inconsistent dataset. O(pixels), exact integer sums.
absl::StatusOr<Normalization> ComputeNormalization(const Dataset& dataset,
                                                   float scale = 1.0f / 255.0f);

// Loads split "train" or "test" of a dataset by name:
//   "fashion_mnist", "mnist"  IDX files in `dir` (see LoadMnistLike)
//   "cifar10"                 binary batches in `dir` (see LoadCifar10)
//   "synthetic"               MakeSyntheticDataset()'s defaults ([1, 28, 28],
//                             10 classes, seed 0): 8192 train samples, 2048
//                             test samples drawn from the same task; `dir`
//                             is ignored
// kInvalidArgument for an unknown name (listing the known ones) or split;
// otherwise the reader's errors, which name the files.
absl::StatusOr<Dataset> LoadDataset(const std::string& name, const std::string& dir,
                                    const std::string& split);

}  // namespace ps::worker::data

#endif  // PS_WORKER_DATA_LOADER_H_
