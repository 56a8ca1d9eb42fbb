#include "worker/data/cifar10_reader.h"

#include <sys/stat.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/test_util.h"

namespace ps::worker::data {
namespace {

using ::ps::worker::data::testing::Bytes;
using ::ps::worker::data::testing::Gzip;
using ::ps::worker::data::testing::PatternBytes;
using ::ps::worker::data::testing::TestDir;
using ::ps::worker::data::testing::WriteFile;
using ::testing::HasSubstr;

constexpr int64_t kPixels = 3 * 32 * 32;

// `labels.size()` records; record r's pixels are PatternBytes(kPixels, seed + r).
Bytes Records(const std::vector<uint8_t>& labels, uint8_t seed) {
  Bytes out;
  for (size_t r = 0; r < labels.size(); ++r) {
    out.push_back(labels[r]);
    const Bytes pixels = PatternBytes(kPixels, static_cast<uint8_t>(seed + r));
    out.insert(out.end(), pixels.begin(), pixels.end());
  }
  return out;
}

// data_batch_1..5.bin with two records each (labels 2b-2 and 2b-1 of batch
// b) and test_batch.bin with three, in `dir`.
void WriteSplits(const std::string& dir, bool gzip) {
  for (int b = 1; b <= 5; ++b) {
    const Bytes records =
        Records({static_cast<uint8_t>(2 * b - 2), static_cast<uint8_t>(2 * b - 1)},
                static_cast<uint8_t>(10 * b));
    WriteFile(absl::StrCat(dir, "/data_batch_", b, ".bin"), gzip ? Gzip(records) : records);
  }
  const Bytes test = Records({3, 1, 4}, 200);
  WriteFile(dir + "/test_batch.bin", gzip ? Gzip(test) : test);
}

TEST(Cifar10ReaderTest, TrainSplitInFileOrder) {
  const std::string dir = TestDir("cifar_train");
  WriteSplits(dir, /*gzip=*/false);
  absl::StatusOr<Dataset> dataset = LoadCifar10(dir, "train");
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ(dataset->name, "cifar10");
  EXPECT_EQ(dataset->sample_shape, (Shape{3, 32, 32}));
  EXPECT_EQ(dataset->num_classes, 10);
  ASSERT_EQ(dataset->size(), 10);
  EXPECT_TRUE(ValidateDataset(*dataset).ok());
  EXPECT_EQ(dataset->pixels.capacity(), dataset->pixels.size());  // allocated once
  for (int64_t i = 0; i < 10; ++i) {
    EXPECT_EQ(dataset->labels[i], i);
    const Bytes expected = PatternBytes(kPixels, static_cast<uint8_t>(10 * (i / 2 + 1) + i % 2));
    EXPECT_EQ(Bytes(dataset->sample(i), dataset->sample(i) + kPixels), expected) << i;
  }
}

TEST(Cifar10ReaderTest, GzippedTestSplitInArchiveSubdirectory) {
  const std::string dir = TestDir("cifar_test");
  ASSERT_EQ(mkdir((dir + "/cifar-10-batches-bin").c_str(), 0755), 0);
  WriteSplits(dir + "/cifar-10-batches-bin", /*gzip=*/true);
  absl::StatusOr<Dataset> dataset = LoadCifar10(dir, "test");
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  ASSERT_EQ(dataset->size(), 3);
  EXPECT_EQ(dataset->pixels.capacity(), dataset->pixels.size());  // from the gzip trailers
  EXPECT_EQ(dataset->labels, (std::vector<int32_t>{3, 1, 4}));
  EXPECT_EQ(Bytes(dataset->sample(2), dataset->sample(2) + kPixels), PatternBytes(kPixels, 202));
}

TEST(Cifar10ReaderTest, MissingFilesAreListed) {
  const std::string dir = TestDir("cifar_missing");
  WriteSplits(dir, /*gzip=*/false);
  ASSERT_EQ(std::remove((dir + "/data_batch_3.bin").c_str()), 0);
  ASSERT_EQ(std::remove((dir + "/data_batch_5.bin").c_str()), 0);
  absl::StatusOr<Dataset> dataset = LoadCifar10(dir, "train");
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(dataset.status().message(), HasSubstr("missing data_batch_3.bin, data_batch_5.bin"));
  EXPECT_THAT(dataset.status().message(), HasSubstr(dir));
  // The test split is still complete.
  EXPECT_TRUE(LoadCifar10(dir, "test").ok());
}

TEST(Cifar10ReaderTest, EmptyDirectoryAndMissingDirectory) {
  const std::string dir = TestDir("cifar_empty");
  absl::StatusOr<Dataset> dataset = LoadCifar10(dir, "test");
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(dataset.status().message(), HasSubstr("test_batch.bin"));
  EXPECT_THAT(dataset.status().message(), HasSubstr(dir + "/cifar-10-batches-bin"));
  dataset = LoadCifar10(dir + "/absent", "test");
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(dataset.status().message(), HasSubstr(dir + "/absent"));
}

TEST(Cifar10ReaderTest, UnknownSplit) {
  absl::StatusOr<Dataset> dataset = LoadCifar10(TestDir("cifar_split"), "val");
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(dataset.status().message(), HasSubstr("val"));
}

TEST(Cifar10ReaderTest, TruncatedFile) {
  const std::string dir = TestDir("cifar_truncated");
  WriteSplits(dir, /*gzip=*/false);
  Bytes records = Records({1, 2, 3}, 0);
  records.resize(2 * kCifar10RecordBytes + 100);
  const std::string path = dir + "/data_batch_4.bin";
  WriteFile(path, records);
  absl::StatusOr<Dataset> dataset = LoadCifar10(dir, "train");
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(dataset.status().message(), HasSubstr(path));
  EXPECT_THAT(dataset.status().message(), HasSubstr("2 records and 100 stray bytes"));
  // Gzipped, the check happens after decompression.
  WriteFile(path, Gzip(records));
  dataset = LoadCifar10(dir, "train");
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(dataset.status().message(), HasSubstr(path));
  EXPECT_THAT(dataset.status().message(), HasSubstr("2 records and 100 stray bytes"));
}

TEST(Cifar10ReaderTest, LabelOutOfRange) {
  const std::string dir = TestDir("cifar_label");
  WriteSplits(dir, /*gzip=*/false);
  const std::string path = dir + "/test_batch.bin";
  WriteFile(path, Records({0, 10, 1}, 0));
  absl::StatusOr<Dataset> dataset = LoadCifar10(dir, "test");
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(dataset.status().message(), HasSubstr(path));
  EXPECT_THAT(dataset.status().message(), HasSubstr("label 10 of record 1"));
}

TEST(Cifar10ReaderTest, CorruptGzip) {
  const std::string dir = TestDir("cifar_gzip");
  WriteSplits(dir, /*gzip=*/false);
  const std::string path = dir + "/test_batch.bin";
  Bytes gz = Gzip(Records({0, 1, 2}, 0));
  gz[gz.size() - 8] ^= 0x01;  // CRC-32
  WriteFile(path, gz);
  absl::StatusOr<Dataset> dataset = LoadCifar10(dir, "test");
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(dataset.status().message(), HasSubstr(path));
  EXPECT_THAT(dataset.status().message(), HasSubstr("corrupt gzip"));
}

// An empty batch file (an interrupted download) is refused by name rather
// than read as no records.
TEST(Cifar10ReaderTest, AnEmptyFileIsRefused) {
  const std::string dir = TestDir("cifar_empty");
  WriteSplits(dir, /*gzip=*/false);
  const std::string path = dir + "/data_batch_3.bin";
  for (const bool gzip : {false, true}) {
    WriteFile(path, gzip ? Gzip(Bytes{}) : Bytes{});
    absl::StatusOr<Dataset> dataset = LoadCifar10(dir, "train");
    EXPECT_EQ(dataset.status().code(), absl::StatusCode::kDataLoss) << gzip;
    EXPECT_THAT(dataset.status().message(), HasSubstr(path + ": holds no record"));
  }
}

TEST(Cifar10ReaderTest, LoadFilesDirectly) {
  const std::string dir = TestDir("cifar_files");
  WriteSplits(dir, /*gzip=*/false);
  absl::StatusOr<Dataset> dataset =
      LoadCifar10Files({dir + "/test_batch.bin", dir + "/data_batch_1.bin"});
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ(dataset->labels, (std::vector<int32_t>{3, 1, 4, 0, 1}));
  const std::string absent = dir + "/data_batch_9.bin";
  dataset = LoadCifar10Files({absent});
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(dataset.status().message(), HasSubstr(absent));
}

}  // namespace
}  // namespace ps::worker::data
