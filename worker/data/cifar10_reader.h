#ifndef PS_WORKER_DATA_CIFAR10_READER_H_
#define PS_WORKER_DATA_CIFAR10_READER_H_

// Reader for CIFAR-10's binary version
// (https://www.cs.toronto.edu/~kriz/cifar.html, cifar-10-binary.tar.gz):
// files of 3073-byte records, each 1 label byte (0..9) then 3072 pixel bytes
// in CHW order (1024 red, 1024 green, 1024 blue, rows of 32).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/data/dataset.h"

namespace ps::worker::data {

inline constexpr int64_t kCifar10RecordBytes = 1 + 3 * 32 * 32;

// Reads the records of the given files, in order, into one Dataset named
// "cifar10" of shape [3, 32, 32] with 10 classes. Each file may be raw or
// gzipped. Errors name the file: kNotFound for a missing file; kDataLoss for
// a size that is not a whole number of records (the count of records and
// stray bytes), a label outside [0, 10) (naming the record), corrupt gzip.
absl::StatusOr<Dataset> LoadCifar10Files(const std::vector<std::string>& paths);

// Loads split "train" (data_batch_1.bin .. data_batch_5.bin, 50000 images)
// or "test" (test_batch.bin, 10000 images) from `dir`, or from
// `dir`/cifar-10-batches-bin, where the official archive unpacks them.
// kInvalidArgument for another split; kNotFound if `dir` does not exist or
// lacks any of the files (the message lists the missing ones and where they
// were looked for); otherwise LoadCifar10Files()'s errors.
absl::StatusOr<Dataset> LoadCifar10(const std::string& dir, const std::string& split);

}  // namespace ps::worker::data

#endif  // PS_WORKER_DATA_CIFAR10_READER_H_
