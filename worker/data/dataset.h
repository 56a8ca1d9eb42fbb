#ifndef PS_WORKER_DATA_DATASET_H_
#define PS_WORKER_DATA_DATASET_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/tensor.h"

namespace ps::worker::data {

// A labelled image classification dataset held in host memory, as it came
// from disk: raw uint8 pixels (1 byte a pixel, 4x smaller than floats), with
// scaling and normalisation done when a batch is gathered (see loader.h).
//
// A plain value: copyable, movable, no hidden state. Readers (idx_reader.h,
// cifar10_reader.h, synthetic.h) return one that satisfies ValidateDataset().
struct Dataset {
  std::string name;             // "fashion_mnist", "cifar10", ... for messages
  Shape sample_shape;           // one sample: [C, H, W]
  int64_t num_classes = 0;      // labels lie in [0, num_classes)
  std::vector<uint8_t> pixels;  // size() * C * H * W bytes, sample-major, CHW
  std::vector<int32_t> labels;  // one per sample

  // Number of samples.
  int64_t size() const { return static_cast<int64_t>(labels.size()); }
  // C * H * W: bytes (and pixels) in one sample; 0 if the shape is not rank 3.
  int64_t sample_elements() const;
  // The pixels of sample i (0 <= i < size(), unchecked).
  const uint8_t* sample(int64_t i) const { return pixels.data() + i * sample_elements(); }
};

// Checks that `dataset` is consistent: sample_shape is [C, H, W] with every
// dimension in [1, 2^20], num_classes >= 1, pixels holds exactly size()
// samples and every label lies in [0, num_classes). O(size()).
// kInvalidArgument naming the dataset and the first problem found otherwise.
absl::Status ValidateDataset(const Dataset& dataset);

// ValidateDataset() without the scan of the labels: O(1), cheap enough to run
// on every batch.
absl::Status ValidateDatasetLayout(const Dataset& dataset);

}  // namespace ps::worker::data

#endif  // PS_WORKER_DATA_DATASET_H_
