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
// Records are read this many at a time (3 MB) and scattered straight into
// the dataset, so a file never sits in memory whole beside it.
constexpr int64_t kRecordsPerRead = 1024;

// Appends the records of `source` to `dataset`.
absl::Status AppendCifarFile(internal::ByteSource& source, Dataset* dataset) {
  const std::string& path = source.path();
  auto not_whole = [&](int64_t size) {
    return absl::DataLossError(
        absl::StrCat(path, ": truncated or corrupt: ", size, " bytes",
                     source.gzipped() ? " (decompressed)" : "", " is not a whole number of ",
                     kCifar10RecordBytes, "-byte records (", size / kCifar10RecordBytes,
                     " records and ", size % kCifar10RecordBytes, " stray bytes)"));
  };
  // A raw file can be checked before reading it; a gzip one at its end.
  if (!source.gzipped() && source.file_bytes() % kCifar10RecordBytes != 0) {
    return not_whole(source.file_bytes());
  }
  std::vector<uint8_t> block(kRecordsPerRead * kCifar10RecordBytes);
  for (int64_t record = 0;;) {
    PS_ASSIGN_OR_RETURN(const int64_t got,
                        source.Read(block.data(), static_cast<int64_t>(block.size())));
    if (got % kCifar10RecordBytes != 0) return not_whole(source.bytes_read());
    for (int64_t r = 0; r < got / kCifar10RecordBytes; ++r, ++record) {
      const uint8_t* bytes = block.data() + r * kCifar10RecordBytes;
      if (bytes[0] >= kNumClasses) {
        return absl::DataLossError(absl::StrCat(path, ": label ", bytes[0], " of record ", record,
                                                " is outside [0, ", kNumClasses, ")"));
      }
      dataset->labels.push_back(bytes[0]);
      dataset->pixels.insert(dataset->pixels.end(), bytes + 1, bytes + kCifar10RecordBytes);
    }
    if (got < static_cast<int64_t>(block.size())) {
      // An empty file (an interrupted download, say) holds no record.
      if (record == 0) return absl::DataLossError(absl::StrCat(path, ": holds no record"));
      return absl::OkStatus();
    }
  }
}

}  // namespace

absl::StatusOr<Dataset> LoadCifar10Files(const std::vector<std::string>& paths) {
  Dataset dataset;
  dataset.name = "cifar10";
  dataset.sample_shape = {3, 32, 32};
  dataset.num_classes = kNumClasses;
  // Every file opened first, so that the dataset is allocated once, at the
  // size the files state (see ByteSource::content_bytes_hint).
  std::vector<std::unique_ptr<internal::ByteSource>> sources;
  int64_t records = 0;
  for (const std::string& path : paths) {
    PS_ASSIGN_OR_RETURN(std::unique_ptr<internal::ByteSource> source,
                        internal::ByteSource::Open(path));
    records += std::max<int64_t>(0, source->content_bytes_hint()) / kCifar10RecordBytes;
    sources.push_back(std::move(source));
  }
  dataset.labels.reserve(records);
  dataset.pixels.reserve(records * (kCifar10RecordBytes - 1));
  for (auto& source : sources) PS_RETURN_IF_ERROR(AppendCifarFile(*source, &dataset));
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
