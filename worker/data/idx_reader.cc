#include "worker/data/idx_reader.h"

#include <array>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/data/byte_source.h"

namespace ps::worker::data {
namespace {

using internal::ByteSource;
using internal::IsDirectory;
using internal::IsRegularFile;

constexpr uint32_t kImagesMagic = 0x00000803;  // unsigned byte, 3 dimensions
constexpr uint32_t kLabelsMagic = 0x00000801;  // unsigned byte, 1 dimension

// One IDX file with its header parsed and its data not yet read.
struct IdxHeader {
  std::unique_ptr<ByteSource> source;
  std::vector<int64_t> dims;
  int64_t header_bytes = 0;
  int64_t data_bytes = 0;  // product of dims
};

uint32_t BigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

// Opens `path`, checks its magic number and reads its `rank` dimensions.
// Checks that the data they promise fits in the file before anyone allocates.
absl::StatusOr<IdxHeader> ReadIdxHeader(const std::string& path, uint32_t magic, int rank,
                                        const char* kind) {
  IdxHeader header;
  PS_ASSIGN_OR_RETURN(header.source, ByteSource::Open(path));
  ByteSource& source = *header.source;
  header.header_bytes = 4 + 4 * rank;
  std::array<uint8_t, 16> bytes{};
  PS_ASSIGN_OR_RETURN(int64_t got, source.Read(bytes.data(), header.header_bytes));
  if (got >= 4 && BigEndian32(bytes.data()) != magic) {
    return absl::DataLossError(absl::StrFormat(
        "%s: wrong magic number for an IDX %s file: expected 0x%08x, found 0x%08x%s", path, kind,
        magic, BigEndian32(bytes.data()), source.gzipped() ? " (after gzip decompression)" : ""));
  }
  if (got < header.header_bytes) {
    return absl::DataLossError(absl::StrCat(path, ": truncated: expected a ", header.header_bytes,
                                            "-byte IDX ", kind, " header, found only ", got,
                                            " bytes"));
  }
  for (int i = 0; i < rank; ++i) header.dims.push_back(BigEndian32(bytes.data() + 4 + 4 * i));
  int64_t product = 1;
  for (int64_t d : header.dims) {
    // Each d < 2^32; refuse a product past 2^62, far beyond any real file.
    if (d != 0 && product > (int64_t{1} << 62) / d) {
      return absl::DataLossError(absl::StrCat(path, ": IDX ", kind, " dimensions ",
                                              absl::StrJoin(header.dims, " x "),
                                              " overflow a 64-bit size: corrupt header"));
    }
    product *= d;
  }
  header.data_bytes = product;
  const int64_t content_bytes = header.header_bytes + header.data_bytes;
  const std::string dims = absl::StrJoin(header.dims, " x ");
  if (content_bytes > source.max_content_bytes()) {
    if (!source.gzipped()) {
      return absl::DataLossError(absl::StrCat(
          path, ": truncated: expected ", content_bytes, " bytes (", header.header_bytes,
          "-byte header + ", dims, " bytes of ", kind, "), file has ", source.file_bytes()));
    }
    return absl::DataLossError(absl::StrCat(
        path, ": truncated or corrupt: the header promises ", content_bytes, " bytes (",
        header.header_bytes, "-byte header + ", dims, " bytes of ", kind, ") but a gzip file of ",
        source.file_bytes(), " bytes cannot hold more than ", source.max_content_bytes()));
  }
  if (!source.gzipped() && content_bytes < source.file_bytes()) {
    return absl::DataLossError(absl::StrCat(
        path, ": expected ", content_bytes, " bytes (", header.header_bytes, "-byte header + ",
        dims, " bytes of ", kind, "), file has ", source.file_bytes(), ": ",
        source.file_bytes() - content_bytes, " unexpected trailing byte(s)"));
  }
  return header;
}

// Reads the data a header promised and checks that nothing follows it.
absl::Status ReadIdxData(IdxHeader& header, const char* kind, std::vector<uint8_t>* out) {
  PS_RETURN_IF_ERROR(header.source->ReadExactly(
      header.data_bytes, absl::StrCat(absl::StrJoin(header.dims, " x "), " bytes of ", kind), out));
  return header.source->ExpectEnd();
}

// The first of `names` that is a file in `dir`, or kNotFound listing them all.
absl::StatusOr<std::string> FindFile(const std::string& dir, const std::vector<std::string>& names,
                                     const std::string& what) {
  for (const std::string& name : names) {
    const std::string path = absl::StrCat(dir, "/", name);
    if (IsRegularFile(path)) return path;
  }
  return absl::NotFoundError(
      absl::StrCat("no ", what, " file in ", dir, ": looked for ", absl::StrJoin(names, ", ")));
}

// The names a file is found under: "train-images-idx3-ubyte" with and
// without .gz, and the "train-images.idx3-ubyte" spelling.
std::vector<std::string> Candidates(const std::string& prefix, const std::string& kind,
                                    const std::string& idx) {
  const std::string dashed = absl::StrCat(prefix, "-", kind, "-", idx, "-ubyte");
  const std::string dotted = absl::StrCat(prefix, "-", kind, ".", idx, "-ubyte");
  return {dashed + ".gz", dashed, dotted + ".gz", dotted};
}

}  // namespace

absl::StatusOr<Dataset> LoadIdxDataset(const std::string& images_path,
                                       const std::string& labels_path, const std::string& name,
                                       int64_t num_classes) {
  if (num_classes < 1 || num_classes > 256) {
    return absl::InvalidArgumentError(absl::StrCat("num_classes for ", name, " is ", num_classes,
                                                   ", must be in [1, 256] for uint8 labels"));
  }
  // Both headers first, so that a count mismatch is found before any data
  // is read.
  PS_ASSIGN_OR_RETURN(IdxHeader images, ReadIdxHeader(images_path, kImagesMagic, 3, "images"));
  PS_ASSIGN_OR_RETURN(IdxHeader labels, ReadIdxHeader(labels_path, kLabelsMagic, 1, "labels"));
  const int64_t n = images.dims[0];
  const int64_t rows = images.dims[1];
  const int64_t cols = images.dims[2];
  // What a dataset may hold (ValidateDataset: every dimension in [1, 2^20])
  // and at least one sample: with none, any rows and cols pass the size
  // check (0 bytes of pixels), and the model would be built for them.
  constexpr int64_t kMaxSide = int64_t{1} << 20;
  if (rows < 1 || cols < 1 || rows > kMaxSide || cols > kMaxSide) {
    return absl::DataLossError(absl::StrCat(images_path, ": images of ", rows, " x ", cols,
                                            " pixels: corrupt header (each side 1 to ",
                                            kMaxSide, ")"));
  }
  if (n == 0) {
    return absl::DataLossError(absl::StrCat(images_path, ": holds no images"));
  }
  if (labels.dims[0] != n) {
    return absl::DataLossError(absl::StrCat("image and label counts differ: ", images_path,
                                            " holds ", n, " images, ", labels_path, " holds ",
                                            labels.dims[0], " labels"));
  }

  Dataset dataset;
  dataset.name = name;
  dataset.sample_shape = {1, rows, cols};
  dataset.num_classes = num_classes;
  PS_RETURN_IF_ERROR(ReadIdxData(images, "images", &dataset.pixels));

  std::vector<uint8_t> label_bytes;
  PS_RETURN_IF_ERROR(ReadIdxData(labels, "labels", &label_bytes));
  dataset.labels.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    if (label_bytes[i] >= num_classes) {
      return absl::DataLossError(absl::StrCat(labels_path, ": label ", label_bytes[i],
                                              " of sample ", i, " is outside [0, ", num_classes,
                                              ") for ", name));
    }
    dataset.labels[i] = label_bytes[i];
  }
  return dataset;
}

absl::StatusOr<Dataset> LoadMnistLike(const std::string& dir, const std::string& split,
                                      const std::string& name) {
  std::string prefix;
  if (split == "train") {
    prefix = "train";
  } else if (split == "test") {
    prefix = "t10k";
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown split '", split, "' for ", name, ": expected train or test"));
  }
  if (!IsDirectory(dir)) {
    return absl::NotFoundError(
        absl::StrCat(name, " directory ", dir, " does not exist or is not a directory"));
  }
  PS_ASSIGN_OR_RETURN(std::string images_path, FindFile(dir, Candidates(prefix, "images", "idx3"),
                                                        absl::StrCat(name, " ", split, " images")));
  PS_ASSIGN_OR_RETURN(std::string labels_path, FindFile(dir, Candidates(prefix, "labels", "idx1"),
                                                        absl::StrCat(name, " ", split, " labels")));
  return LoadIdxDataset(images_path, labels_path, name);
}

}  // namespace ps::worker::data
