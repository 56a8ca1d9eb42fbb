#ifndef PS_WORKER_DATA_SYNTHETIC_H_
#define PS_WORKER_DATA_SYNTHETIC_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "common/tensor.h"
#include "worker/data/dataset.h"

namespace ps::worker::data {

// A synthetic classification task for tests and benchmarks, learnable by
// every model: each class has a prototype image of random 4x4-pixel blocks
// (so convolutions and pooling see spatial structure), and a sample is its
// class's prototype plus independent uniform noise, clamped to [0, 255].
struct SyntheticOptions {
  Shape sample_shape = {1, 28, 28};  // [C, H, W]
  int64_t num_classes = 10;
  int64_t size = 1024;  // samples
  // Fixes the task (the prototypes) and every sample. Identical on every
  // machine, compiler and standard library.
  uint64_t seed = 0;
  // Sample i of the dataset is sample first_index + i of the task's endless
  // stream, so datasets with the same seed and disjoint index ranges are
  // independent draws from one task (a train split and a test split).
  int64_t first_index = 0;
  // Half-width of the uniform pixel noise, in pixel units [0, 255]. Prototype
  // pixels of two classes differ by about 85 on average, so the default
  // makes single pixels ambiguous but whole images easy.
  int noise = 64;
};

// The dataset "synthetic" described by `options`: labels are uniform over the
// classes, drawn per sample. Each sample is a pure function of (seed,
// first_index + i), independent of `size`. kInvalidArgument for a shape that
// is not [C, H, W] with positive dimensions, num_classes < 1, size < 0,
// first_index < 0 or noise outside [0, 255].
absl::StatusOr<Dataset> MakeSyntheticDataset(const SyntheticOptions& options);

}  // namespace ps::worker::data

#endif  // PS_WORKER_DATA_SYNTHETIC_H_
