#ifndef PS_WORKER_DATA_IDX_READER_H_
#define PS_WORKER_DATA_IDX_READER_H_

// Readers for the IDX format of MNIST and Fashion-MNIST
// (http://yann.lecun.com/exdb/mnist/): a big-endian header, then uint8 data.
//   images: magic 0x00000803, N, rows, cols (uint32 each), N*rows*cols pixels
//   labels: magic 0x00000801, N (uint32), N label bytes
// Files may be raw or gzip-compressed; gzip is detected by its magic bytes
// (1f 8b), not by the file name.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "worker/data/dataset.h"

namespace ps::worker::data {

// Reads an IDX image file and its label file into a Dataset of shape
// [1, rows, cols] named `name`, with labels in [0, num_classes).
//
// Errors name the offending file:
//   kNotFound / kFailedPrecondition  missing file, or a directory
//   kDataLoss  wrong magic number (expected and found, in hex); zero or
//              overflowing dimensions; truncated file or trailing bytes
//              (expected and actual byte counts); corrupt or truncated gzip;
//              image and label counts that differ (naming both files); a
//              label outside [0, num_classes) (naming the sample)
// The header's sizes are checked against the file's size before any memory
// is allocated for the data.
absl::StatusOr<Dataset> LoadIdxDataset(const std::string& images_path,
                                       const std::string& labels_path, const std::string& name,
                                       int64_t num_classes = 10);

// Loads split "train" or "test" of an MNIST-like dataset from directory
// `dir`, which holds the standard file names, each raw or gzipped:
//   train-images-idx3-ubyte[.gz]  train-labels-idx1-ubyte[.gz]
//   t10k-images-idx3-ubyte[.gz]   t10k-labels-idx1-ubyte[.gz]
// (also the "train-images.idx3-ubyte" spelling of some mirrors). Debian's
// dataset-fashion-mnist installs the .gz files to
// /usr/share/datasets/fashion-mnist.
//
// kInvalidArgument for another split; kNotFound if `dir` does not exist or
// holds none of the candidate names (the message lists the names looked
// for); otherwise LoadIdxDataset()'s errors.
absl::StatusOr<Dataset> LoadMnistLike(const std::string& dir, const std::string& split,
                                      const std::string& name = "mnist");

}  // namespace ps::worker::data

#endif  // PS_WORKER_DATA_IDX_READER_H_
