#include "worker/data/cifar10_reader.h"

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/data/byte_source.h"

namespace ps::worker::data {
namespace {

constexpr int64_t kNumClasses = 10;
constexpr int64_t kPixelBytes = kCifar10RecordBytes - 1;

// Appends the records of one file to `dataset`.
absl::Status AppendCifarFile(const std::string& path, Dataset* dataset) {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<internal::ByteSource> source,
                      internal::ByteSource::Open(path));
  std::vector<uint8_t> bytes;
  // A raw file can be checked before reading it; a gzip one after.
  if (!source->gzipped()) {
    if (source->file_bytes() % kCifar10RecordBytes != 0) {
      return absl::DataLossError(
          absl::StrCat(path, ": truncated or corrupt: ", source->file_bytes(),
                       " bytes is not a whole number of ", kCifar10RecordBytes, "-byte records (",
                       source->file_bytes() / kCifar10RecordBytes, " records and ",
                       source->file_bytes() % kCifar10RecordBytes, " stray bytes)"));
    }
    bytes.reserve(source->file_bytes());
  }
  PS_RETURN_IF_ERROR(source->ReadToEnd(&bytes));
  const int64_t size = static_cast<int64_t>(bytes.size());
  if (size % kCifar10RecordBytes != 0) {
    return absl::DataLossError(
        absl::StrCat(path, ": truncated or corrupt: ", size, " bytes",
                     source->gzipped() ? " (decompressed)" : "", " is not a whole number of ",
                     kCifar10RecordBytes, "-byte records (", size / kCifar10RecordBytes,
                     " records and ", size % kCifar10RecordBytes, " stray bytes)"));
  }
  const int64_t records = size / kCifar10RecordBytes;
  const int64_t first = dataset->size();
  dataset->labels.resize(first + records);
  dataset->pixels.resize((first + records) * kPixelBytes);
  for (int64_t r = 0; r < records; ++r) {
    const uint8_t* record = bytes.data() + r * kCifar10RecordBytes;
    if (record[0] >= kNumClasses) {
      return absl::DataLossError(absl::StrCat(path, ": label ", record[0], " of record ", r,
                                              " is outside [0, ", kNumClasses, ")"));
    }
    dataset->labels[first + r] = record[0];
    std::copy(record + 1, record + kCifar10RecordBytes,
              dataset->pixels.data() + (first + r) * kPixelBytes);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Dataset> LoadCifar10Files(const std::vector<std::string>& paths) {
  Dataset dataset;
  dataset.name = "cifar10";
  dataset.sample_shape = {3, 32, 32};
  dataset.num_classes = kNumClasses;
  for (const std::string& path : paths) {
    PS_RETURN_IF_ERROR(AppendCifarFile(path, &dataset));
  }
  return dataset;
}

absl::StatusOr<Dataset> LoadCifar10(const std::string& dir, const std::string& split) {
  std::vector<std::string> names;
  if (split == "train") {
    for (int i = 1; i <= 5; ++i) names.push_back(absl::StrCat("data_batch_", i, ".bin"));
  } else if (split == "test") {
    names.push_back("test_batch.bin");
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown split '", split, "' for cifar10: expected train or test"));
  }
  if (!internal::IsDirectory(dir)) {
    return absl::NotFoundError(
        absl::StrCat("cifar10 directory ", dir, " does not exist or is not a directory"));
  }
  // The files must all come from one directory: `dir` or its subdirectory.
  const std::vector<std::string> dirs = {dir, absl::StrCat(dir, "/cifar-10-batches-bin")};
  std::vector<std::string> missing_in_dir;
  for (const std::string& d : dirs) {
    std::vector<std::string> paths, missing;
    for (const std::string& name : names) {
      const std::string path = absl::StrCat(d, "/", name);
      if (internal::IsRegularFile(path)) {
        paths.push_back(path);
      } else {
        missing.push_back(name);
      }
    }
    if (missing.empty()) return LoadCifar10Files(paths);
    if (missing_in_dir.empty() || missing.size() < missing_in_dir.size()) missing_in_dir = missing;
  }
  return absl::NotFoundError(absl::StrCat(
      "cifar10 ", split, " split not found: missing ", absl::StrJoin(missing_in_dir, ", "),
      " (looked for ", absl::StrJoin(names, ", "), " in ", absl::StrJoin(dirs, " and "), ")"));
}

}  // namespace ps::worker::data
