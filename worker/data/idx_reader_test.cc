#include "worker/data/idx_reader.h"

#include <sys/stat.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/rng.h"
#include "worker/data/byte_source.h"
#include "worker/data/test_util.h"

namespace ps::worker::data {
namespace {

using ::ps::worker::data::testing::Bytes;
using ::ps::worker::data::testing::Gzip;
using ::ps::worker::data::testing::IdxHeader;
using ::ps::worker::data::testing::IdxImages;
using ::ps::worker::data::testing::IdxLabels;
using ::ps::worker::data::testing::PatternBytes;
using ::ps::worker::data::testing::TestDir;
using ::ps::worker::data::testing::WriteFile;
using ::testing::HasSubstr;

constexpr uint32_t kN = 3, kRows = 4, kCols = 5;

// Writes a valid 3-sample 4x5 image file and its labels; returns the paths.
struct Files {
  std::string images, labels;
  Bytes pixels, label_bytes;
};

Files WriteValid(const std::string& dir, bool gzip, const std::string& images_name = "images",
                 const std::string& labels_name = "labels") {
  Files files;
  files.pixels = PatternBytes(kN * kRows * kCols, 3);
  files.label_bytes = {7, 0, 9};
  files.images = absl::StrCat(dir, "/", images_name);
  files.labels = absl::StrCat(dir, "/", labels_name);
  const Bytes images = IdxImages(kN, kRows, kCols, files.pixels);
  const Bytes labels = IdxLabels(kN, files.label_bytes);
  WriteFile(files.images, gzip ? Gzip(images) : images);
  WriteFile(files.labels, gzip ? Gzip(labels) : labels);
  return files;
}

void ExpectMatches(const Dataset& dataset, const Files& files) {
  EXPECT_EQ(dataset.sample_shape, (Shape{1, kRows, kCols}));
  EXPECT_EQ(dataset.num_classes, 10);
  EXPECT_EQ(dataset.size(), kN);
  EXPECT_EQ(dataset.pixels, files.pixels);
  EXPECT_EQ(dataset.labels, (std::vector<int32_t>{7, 0, 9}));
  EXPECT_TRUE(ValidateDataset(dataset).ok());
}

TEST(IdxReaderTest, RoundTripRaw) {
  const Files files = WriteValid(TestDir("idx_raw"), /*gzip=*/false);
  absl::StatusOr<Dataset> dataset = LoadIdxDataset(files.images, files.labels, "mnist");
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ(dataset->name, "mnist");
  ExpectMatches(*dataset, files);
}

TEST(IdxReaderTest, RoundTripGzipDetectedByMagicNotName) {
  // No .gz in the names: the reader must look at the bytes.
  const Files files = WriteValid(TestDir("idx_gzip"), /*gzip=*/true);
  absl::StatusOr<Dataset> dataset = LoadIdxDataset(files.images, files.labels, "fashion_mnist");
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  ExpectMatches(*dataset, files);
}

TEST(IdxReaderTest, LargerThanOneReadChunk) {
  // More than the reader's 1 MiB pieces, gzipped: exercises incremental reads.
  const std::string dir = TestDir("idx_large");
  const uint32_t n = 2000, rows = 28, cols = 28;
  const Bytes pixels = PatternBytes(int64_t{n} * rows * cols, 1);
  Bytes labels(n);
  for (uint32_t i = 0; i < n; ++i) labels[i] = i % 10;
  WriteFile(dir + "/images", Gzip(IdxImages(n, rows, cols, pixels)));
  WriteFile(dir + "/labels", IdxLabels(n, labels));
  absl::StatusOr<Dataset> dataset = LoadIdxDataset(dir + "/images", dir + "/labels", "mnist");
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ(dataset->pixels, pixels);
  EXPECT_EQ(dataset->labels[1234], 4);
  // Allocated once at the size the gzip trailer states, not doubled piece
  // by piece (which leaves every earlier block in the heap).
  EXPECT_EQ(dataset->pixels.capacity(), pixels.size());
}

TEST(IdxReaderTest, ContentSizeHints) {
  const std::string dir = TestDir("idx_hints");
  const Bytes content = IdxImages(3, 2, 2, PatternBytes(12, 5));
  WriteFile(dir + "/raw", content);
  WriteFile(dir + "/gz", Gzip(content));
  WriteFile(dir + "/tiny", Bytes{0x1f, 0x8b, 8});
  for (const char* name : {"raw", "gz"}) {
    auto source = internal::ByteSource::Open(dir + "/" + name);
    ASSERT_TRUE(source.ok()) << source.status();
    EXPECT_EQ((*source)->content_bytes_hint(), static_cast<int64_t>(content.size())) << name;
  }
  // Too short to have a trailer: no hint (and the read fails on its own).
  auto tiny = internal::ByteSource::Open(dir + "/tiny");
  ASSERT_TRUE(tiny.ok());
  EXPECT_EQ((*tiny)->content_bytes_hint(), -1);
  // A trailer claiming 4 GB: the hint is what the file can hold at most
  // (readers reserve it), not the claim.
  Bytes lying = Gzip(content);
  for (size_t i = lying.size() - 4; i < lying.size(); ++i) lying[i] = 0xff;
  WriteFile(dir + "/lying", lying);
  auto source = internal::ByteSource::Open(dir + "/lying");
  ASSERT_TRUE(source.ok());
  EXPECT_EQ((*source)->content_bytes_hint(), (*source)->max_content_bytes());
  EXPECT_LT((*source)->content_bytes_hint(), int64_t{0xffffffff});
}

TEST(IdxReaderTest, LoadMnistLikeFindsStandardNames) {
  const std::string dir = TestDir("idx_mnist_like");
  const Files train =
      WriteValid(dir, /*gzip=*/true, "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz");
  const Files test =
      WriteValid(dir, /*gzip=*/false, "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte");
  absl::StatusOr<Dataset> train_set = LoadMnistLike(dir, "train", "fashion_mnist");
  ASSERT_TRUE(train_set.ok()) << train_set.status();
  EXPECT_EQ(train_set->name, "fashion_mnist");
  ExpectMatches(*train_set, train);
  absl::StatusOr<Dataset> test_set = LoadMnistLike(dir, "test");
  ASSERT_TRUE(test_set.ok()) << test_set.status();
  ExpectMatches(*test_set, test);
}

TEST(IdxReaderTest, LoadMnistLikeFindsDottedNames) {
  const std::string dir = TestDir("idx_dotted");
  const Files files =
      WriteValid(dir, /*gzip=*/false, "train-images.idx3-ubyte", "train-labels.idx1-ubyte");
  absl::StatusOr<Dataset> dataset = LoadMnistLike(dir, "train");
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  ExpectMatches(*dataset, files);
}

TEST(IdxReaderTest, UnknownSplit) {
  absl::StatusOr<Dataset> dataset = LoadMnistLike(TestDir("idx_split"), "validation");
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(dataset.status().message(), HasSubstr("validation"));
}

TEST(IdxReaderTest, MissingDirectory) {
  const std::string dir = TestDir("idx_nodir") + "/absent";
  absl::StatusOr<Dataset> dataset = LoadMnistLike(dir, "train");
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(dataset.status().message(), HasSubstr(dir));
}

TEST(IdxReaderTest, DirectoryWithoutFilesListsWhatWasLookedFor) {
  const std::string dir = TestDir("idx_empty_dir");
  absl::StatusOr<Dataset> dataset = LoadMnistLike(dir, "test");
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(dataset.status().message(), HasSubstr(dir));
  EXPECT_THAT(dataset.status().message(), HasSubstr("t10k-images-idx3-ubyte.gz"));
  EXPECT_THAT(dataset.status().message(), HasSubstr("t10k-images-idx3-ubyte,"));
}

TEST(IdxReaderTest, MissingLabelsListed) {
  const std::string dir = TestDir("idx_no_labels");
  WriteValid(dir, /*gzip=*/false, "train-images-idx3-ubyte", "unrelated");
  absl::StatusOr<Dataset> dataset = LoadMnistLike(dir, "train");
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(dataset.status().message(), HasSubstr("train-labels-idx1-ubyte.gz"));
}

TEST(IdxReaderTest, MissingFileIsNamed) {
  const Files files = WriteValid(TestDir("idx_missing"), /*gzip=*/false);
  const std::string absent = files.images + ".absent";
  absl::StatusOr<Dataset> dataset = LoadIdxDataset(absent, files.labels, "mnist");
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(dataset.status().message(), HasSubstr(absent));
}

TEST(IdxReaderTest, DirectoryInsteadOfFile) {
  const std::string dir = TestDir("idx_is_dir");
  const Files files = WriteValid(dir, /*gzip=*/false);
  absl::StatusOr<Dataset> dataset = LoadIdxDataset(files.images, dir, "mnist");
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(dataset.status().message(), HasSubstr(dir));
  EXPECT_THAT(dataset.status().message(), HasSubstr("directory"));
}

TEST(IdxReaderTest, WrongMagicShowsExpectedAndFoundInHex) {
  // Images and labels swapped.
  const Files files = WriteValid(TestDir("idx_magic"), /*gzip=*/false);
  absl::StatusOr<Dataset> dataset = LoadIdxDataset(files.labels, files.images, "mnist");
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(dataset.status().message(), HasSubstr(files.labels));
  EXPECT_THAT(dataset.status().message(), HasSubstr("expected 0x00000803, found 0x00000801"));
}

TEST(IdxReaderTest, WrongMagicInGzip) {
  const std::string dir = TestDir("idx_magic_gz");
  const Files files = WriteValid(dir, /*gzip=*/false);
  const std::string path = dir + "/text.gz";
  WriteFile(path, Gzip({'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd', '!', '!'}));
  absl::StatusOr<Dataset> dataset = LoadIdxDataset(path, files.labels, "mnist");
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(dataset.status().message(), HasSubstr(path));
  EXPECT_THAT(dataset.status().message(), HasSubstr("expected 0x00000803, found 0x68656c6c"));
}

TEST(IdxReaderTest, TruncatedHeader) {
  const std::string dir = TestDir("idx_short_header");
  const Files files = WriteValid(dir, /*gzip=*/false);
  const std::string path = dir + "/short";
  WriteFile(path, {0, 0, 8, 3, 0, 0});
  absl::StatusOr<Dataset> dataset = LoadIdxDataset(path, files.labels, "mnist");
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(dataset.status().message(), HasSubstr(path));
  EXPECT_THAT(dataset.status().message(), HasSubstr("16-byte"));
  EXPECT_THAT(dataset.status().message(), HasSubstr("found only 6 bytes"));
}

TEST(IdxReaderTest, EmptyFile) {
  const std::string dir = TestDir("idx_empty_file");
  const Files files = WriteValid(dir, /*gzip=*/false);
  const std::string path = dir + "/empty";
  WriteFile(path, {});
  absl::StatusOr<Dataset> dataset = LoadIdxDataset(files.images, path, "mnist");
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(dataset.status().message(), HasSubstr(path));
}

TEST(IdxReaderTest, TruncatedRawDataGivesExpectedAndActualBytes) {
  const std::string dir = TestDir("idx_truncated");
  const Files files = WriteValid(dir, /*gzip=*/false);
  Bytes images = IdxImages(kN, kRows, kCols, files.pixels);
  images.resize(images.size() - 7);  // 16 + 60 - 7 = 69 bytes
  WriteFile(files.images, images);
  absl::StatusOr<Dataset> dataset = LoadIdxDataset(files.images, files.labels, "mnist");
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(dataset.status().message(), HasSubstr(files.images));
  EXPECT_THAT(dataset.status().message(), HasSubstr("expected 76 bytes"));
  EXPECT_THAT(dataset.status().message(), HasSubstr("file has 69"));
}

TEST(IdxReaderTest, TrailingBytes) {
  const std::string dir = TestDir("idx_trailing");
  const Files files = WriteValid(dir, /*gzip=*/false);
  Bytes labels = IdxLabels(kN, files.label_bytes);
  labels.push_back(1);
  labels.push_back(2);
  WriteFile(files.labels, labels);
  absl::StatusOr<Dataset> dataset = LoadIdxDataset(files.images, files.labels, "mnist");
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(dataset.status().message(), HasSubstr(files.labels));
  EXPECT_THAT(dataset.status().message(), HasSubstr("2 unexpected trailing byte(s)"));
}

TEST(IdxReaderTest, TrailingBytesInGzip) {
  const std::string dir = TestDir("idx_trailing_gz");
  const Files files = WriteValid(dir, /*gzip=*/false);
  Bytes labels = IdxLabels(kN, files.label_bytes);
  labels.push_back(1);
  WriteFile(files.labels, Gzip(labels));
  absl::StatusOr<Dataset> dataset = LoadIdxDataset(files.images, files.labels, "mnist");
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(dataset.status().message(), HasSubstr(files.labels));
  EXPECT_THAT(dataset.status().message(), HasSubstr("unexpected data"));
}

TEST(IdxReaderTest, GzipOfTruncatedContent) {
  // A valid gzip stream whose content is shorter than its header promises.
  const std::string dir = TestDir("idx_gz_short_content");
  const Files files = WriteValid(dir, /*gzip=*/false);
  Bytes images = IdxImages(kN, kRows, kCols, files.pixels);
  images.resize(images.size() - 10);
  WriteFile(files.images, Gzip(images));
  absl::StatusOr<Dataset> dataset = LoadIdxDataset(files.images, files.labels, "mnist");
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(dataset.status().message(), HasSubstr(files.images));
  EXPECT_THAT(dataset.status().message(), HasSubstr("expected 76 bytes (decompressed)"));
  EXPECT_THAT(dataset.status().message(), HasSubstr("found only 66"));
}

TEST(IdxReaderTest, TruncatedGzipStream) {
  const std::string dir = TestDir("idx_gz_cut");
  const Files files = WriteValid(dir, /*gzip=*/false);
  Bytes gz = Gzip(IdxImages(kN, kRows, kCols, files.pixels));
  gz.resize(gz.size() - 20);  // cuts the trailer and some deflate data
  WriteFile(files.images, gz);
  absl::StatusOr<Dataset> dataset = LoadIdxDataset(files.images, files.labels, "mnist");
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(dataset.status().message(), HasSubstr(files.images));
  EXPECT_THAT(dataset.status().message(), HasSubstr("truncated"));
}

TEST(IdxReaderTest, CorruptGzipChecksum) {
  const std::string dir = TestDir("idx_gz_crc");
  const Files files = WriteValid(dir, /*gzip=*/false);
  Bytes gz = Gzip(IdxImages(kN, kRows, kCols, files.pixels));
  gz[gz.size() - 8] ^= 0xff;  // the CRC-32 of the trailer
  WriteFile(files.images, gz);
  absl::StatusOr<Dataset> dataset = LoadIdxDataset(files.images, files.labels, "mnist");
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(dataset.status().message(), HasSubstr(files.images));
  EXPECT_THAT(dataset.status().message(), HasSubstr("corrupt gzip"));
}

TEST(IdxReaderTest, CorruptGzipData) {
  const std::string dir = TestDir("idx_gz_data");
  const Files files = WriteValid(dir, /*gzip=*/false);
  Bytes gz = Gzip(IdxImages(kN, kRows, kCols, files.pixels));
  for (size_t i = 12; i < gz.size() - 8; i += 3) gz[i] ^= 0x5a;
  WriteFile(files.images, gz);
  absl::StatusOr<Dataset> dataset = LoadIdxDataset(files.images, files.labels, "mnist");
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(dataset.status().message(), HasSubstr(files.images));
}

TEST(IdxReaderTest, CountsDiffer) {
  const std::string dir = TestDir("idx_counts");
  const Files files = WriteValid(dir, /*gzip=*/false);
  WriteFile(files.labels, IdxLabels(2, {1, 2}));
  absl::StatusOr<Dataset> dataset = LoadIdxDataset(files.images, files.labels, "mnist");
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(dataset.status().message(), HasSubstr(files.images));
  EXPECT_THAT(dataset.status().message(), HasSubstr(files.labels));
  EXPECT_THAT(dataset.status().message(), HasSubstr("3 images"));
  EXPECT_THAT(dataset.status().message(), HasSubstr("2 labels"));
}

TEST(IdxReaderTest, LabelOutOfRange) {
  const std::string dir = TestDir("idx_label_range");
  const Files files = WriteValid(dir, /*gzip=*/false);
  WriteFile(files.labels, IdxLabels(kN, {1, 2, 10}));
  absl::StatusOr<Dataset> dataset = LoadIdxDataset(files.images, files.labels, "mnist");
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(dataset.status().message(), HasSubstr(files.labels));
  EXPECT_THAT(dataset.status().message(), HasSubstr("label 10 of sample 2"));
  // The same file is fine with more classes.
  EXPECT_TRUE(LoadIdxDataset(files.images, files.labels, "mnist", 11).ok());
}

TEST(IdxReaderTest, DimensionsThatOverflow) {
  const std::string dir = TestDir("idx_overflow");
  const Files files = WriteValid(dir, /*gzip=*/false);
  WriteFile(files.images, IdxHeader(0x803, {0xffffffffu, 0xffffffffu, 0xffffffffu}));
  absl::StatusOr<Dataset> dataset = LoadIdxDataset(files.images, files.labels, "mnist");
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(dataset.status().message(), HasSubstr(files.images));
  EXPECT_THAT(dataset.status().message(), HasSubstr("overflow"));
}

TEST(IdxReaderTest, HostileHeaderAllocatesNothing) {
  // 4 billion 28x28 images promised by a 16-byte file, raw and gzipped. The
  // claim must be refused before any allocation (which would throw or OOM).
  const std::string dir = TestDir("idx_hostile");
  const Files files = WriteValid(dir, /*gzip=*/false);
  const Bytes header = IdxHeader(0x803, {0xffffffffu, 28, 28});
  for (bool gzip : {false, true}) {
    WriteFile(files.images, gzip ? Gzip(header) : header);
    absl::StatusOr<Dataset> dataset = LoadIdxDataset(files.images, files.labels, "mnist");
    EXPECT_EQ(dataset.status().code(), absl::StatusCode::kDataLoss) << dataset.status();
    EXPECT_THAT(dataset.status().message(), HasSubstr(files.images));
    EXPECT_THAT(dataset.status().message(), HasSubstr("3367254359296 bytes"));
  }
  // Labels too: their header is checked before the counts are compared.
  WriteFile(files.images, IdxImages(kN, kRows, kCols, files.pixels));
  WriteFile(files.labels, Gzip(IdxHeader(0x801, {0x7fffffffu})));
  absl::StatusOr<Dataset> dataset = LoadIdxDataset(files.images, files.labels, "mnist");
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(dataset.status().message(), HasSubstr(files.labels));
  EXPECT_THAT(dataset.status().message(), HasSubstr("cannot hold more than"));
}

TEST(IdxReaderTest, ZeroSizedImages) {
  const std::string dir = TestDir("idx_zero");
  const Files files = WriteValid(dir, /*gzip=*/false);
  WriteFile(files.images, IdxImages(kN, 0, kCols, {}));
  absl::StatusOr<Dataset> dataset = LoadIdxDataset(files.images, files.labels, "mnist");
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(dataset.status().message(), HasSubstr(files.images));
}

// No samples: any rows and cols pass the size check (0 bytes of pixels),
// and the model would be built for them, so an empty file pair, or sides
// beyond a dataset's 2^20, are refused by name.
TEST(IdxReaderTest, NoImagesOrSidesBeyondTheBoundAreRefused) {
  const std::string dir = TestDir("idx_empty");
  const Files files = WriteValid(dir, /*gzip=*/false);
  WriteFile(files.images, IdxHeader(0x803, {0, 0xffffffffu, 0xffffffffu}));
  WriteFile(files.labels, IdxHeader(0x801, {0}));
  absl::StatusOr<Dataset> dataset = LoadIdxDataset(files.images, files.labels, "mnist");
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(dataset.status().message(), HasSubstr(files.images));
  EXPECT_THAT(dataset.status().message(), HasSubstr("each side 1 to 1048576"));
  WriteFile(files.images, IdxHeader(0x803, {0, 28, 28}));
  dataset = LoadIdxDataset(files.images, files.labels, "mnist");
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(dataset.status().message(), HasSubstr("holds no images"));
}

TEST(IdxReaderTest, RandomCorruptionNeverCrashes) {
  // Flipped bytes and cuts anywhere, raw and gzipped: each load either
  // succeeds or fails with a status that names a file.
  const std::string dir = TestDir("idx_fuzz");
  const Files files = WriteValid(dir, /*gzip=*/false);
  const Bytes valid_images = IdxImages(kN, kRows, kCols, files.pixels);
  const Bytes valid_labels = IdxLabels(kN, files.label_bytes);
  SplitMix64 rng(2024);
  for (int trial = 0; trial < 400; ++trial) {
    const bool labels = trial % 2 == 1;
    const bool gzip = (trial / 2) % 2 == 1;
    Bytes bytes =
        gzip ? Gzip(labels ? valid_labels : valid_images) : (labels ? valid_labels : valid_images);
    if (rng.Below(3) == 0) {
      bytes.resize(rng.Below(bytes.size()));
    } else {
      for (uint64_t k = rng.Below(3) + 1; k > 0; --k) {
        bytes[rng.Below(bytes.size())] ^= static_cast<uint8_t>(rng.Below(255) + 1);
      }
    }
    const std::string& path = labels ? files.labels : files.images;
    WriteFile(path, bytes);
    absl::StatusOr<Dataset> dataset = LoadIdxDataset(files.images, files.labels, "mnist");
    if (dataset.ok()) {
      EXPECT_TRUE(ValidateDataset(*dataset).ok()) << trial;
    } else {
      EXPECT_THAT(dataset.status().message(), HasSubstr(dir)) << trial;
    }
    WriteFile(path, labels ? valid_labels : valid_images);
  }
}

// The real Fashion-MNIST, as Debian's dataset-fashion-mnist installs it.
constexpr char kFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

TEST(IdxReaderTest, RealFashionMnist) {
  struct stat info;
  if (stat(kFashionMnistDir, &info) != 0) {
    GTEST_SKIP() << kFashionMnistDir
                 << " is absent: install Debian's dataset-fashion-mnist to run this test";
  }
  for (const auto& [split, size] : {std::pair<std::string, int64_t>{"train", 60000},
                                    std::pair<std::string, int64_t>{"test", 10000}}) {
    absl::StatusOr<Dataset> dataset = LoadMnistLike(kFashionMnistDir, split, "fashion_mnist");
    ASSERT_TRUE(dataset.ok()) << dataset.status();
    EXPECT_EQ(dataset->size(), size) << split;
    EXPECT_EQ(dataset->sample_shape, (Shape{1, 28, 28}));
    EXPECT_EQ(dataset->num_classes, 10);
    EXPECT_TRUE(ValidateDataset(*dataset).ok());
    // Fashion-MNIST is balanced: a tenth of each split per class.
    std::vector<int64_t> per_class(10, 0);
    for (int32_t label : dataset->labels) ++per_class[label];
    EXPECT_EQ(per_class, std::vector<int64_t>(10, size / 10)) << split;
    // The first image of both splits is an ankle boot (class 9).
    EXPECT_EQ(dataset->labels[0], 9) << split;
  }
}

}  // namespace
}  // namespace ps::worker::data
