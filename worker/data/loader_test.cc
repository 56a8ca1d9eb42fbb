#include "worker/data/loader.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/synthetic.h"
#include "worker/data/test_util.h"

namespace ps::worker::data {
namespace {

using ::ps::worker::data::testing::Gzip;
using ::ps::worker::data::testing::IdxImages;
using ::ps::worker::data::testing::IdxLabels;
using ::ps::worker::data::testing::PatternBytes;
using ::ps::worker::data::testing::TestDir;
using ::ps::worker::data::testing::WriteFile;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

bool IsPermutation(const std::vector<int64_t>& order) {
  std::vector<int64_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] != static_cast<int64_t>(i)) return false;
  }
  return true;
}

TEST(EpochOrderTest, IdentityWithoutShuffle) {
  EXPECT_THAT(EpochOrder(5, 42, 3, /*shuffle=*/false), ElementsAre(0, 1, 2, 3, 4));
}

TEST(EpochOrderTest, EmptyAndSingle) {
  EXPECT_TRUE(EpochOrder(0, 1, 0, true).empty());
  EXPECT_TRUE(EpochOrder(-5, 1, 0, true).empty());
  EXPECT_THAT(EpochOrder(1, 1, 0, true), ElementsAre(0));
}

TEST(EpochOrderTest, PermutationDeterministicInSeedAndEpoch) {
  for (int64_t size : {2, 3, 10, 1000, 60000}) {
    const std::vector<int64_t> order = EpochOrder(size, 7, 0, true);
    ASSERT_EQ(static_cast<int64_t>(order.size()), size);
    EXPECT_TRUE(IsPermutation(order)) << size;
    EXPECT_EQ(order, EpochOrder(size, 7, 0, true)) << size;
  }
  const std::vector<int64_t> base = EpochOrder(1000, 7, 0, true);
  EXPECT_NE(base, EpochOrder(1000, 7, 1, true));  // another epoch
  EXPECT_NE(base, EpochOrder(1000, 8, 0, true));  // another seed
  std::vector<int64_t> identity(1000);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_NE(base, identity);
}

TEST(EpochOrderTest, GoldenValuesPinTheShuffle) {
  // Workers on different machines must agree on this order; a change here
  // changes every run's data order. (Cross-checked against an independent
  // Python implementation of SplitMix64 + Fisher-Yates.)
  EXPECT_EQ(EpochOrder(10, 42, 0, true), (std::vector<int64_t>{9, 2, 3, 8, 0, 7, 1, 4, 6, 5}));
  EXPECT_EQ(EpochOrder(10, 42, 1, true), (std::vector<int64_t>{3, 6, 4, 1, 2, 7, 5, 0, 8, 9}));
}

TEST(EpochOrderTest, RoughlyUniform) {
  // Each of the 6 orders of 3 elements should come up about equally often.
  std::map<std::vector<int64_t>, int> counts;
  const int epochs = 6000;
  for (int epoch = 0; epoch < epochs; ++epoch) ++counts[EpochOrder(3, 99, epoch, true)];
  EXPECT_EQ(counts.size(), 6u);
  for (const auto& [order, count] : counts) EXPECT_NEAR(count, epochs / 6, 150);
  // And each position of a longer order sees each element about equally.
  std::vector<int> first(8, 0);
  for (int epoch = 0; epoch < 8000; ++epoch) ++first[EpochOrder(8, 5, epoch, true)[0]];
  for (int count : first) EXPECT_NEAR(count, 1000, 150);
}

// Two channels of 2x3 pixels, three samples.
Dataset SmallDataset() {
  Dataset dataset;
  dataset.name = "small";
  dataset.sample_shape = {2, 2, 3};
  dataset.num_classes = 4;
  for (int i = 0; i < 3 * 12; ++i) dataset.pixels.push_back(static_cast<uint8_t>(i * 7));
  dataset.labels = {3, 0, 2};
  return dataset;
}

TEST(GatherBatchTest, ScalesByDefault) {
  const Dataset dataset = SmallDataset();
  const std::vector<int64_t> indices = {2, 0, 2};
  std::vector<float> images(3 * 12, -1.f);
  std::vector<int32_t> labels(3, -1);
  ASSERT_TRUE(
      GatherBatch(dataset, indices, Normalization(), absl::MakeSpan(images), absl::MakeSpan(labels))
          .ok());
  EXPECT_THAT(labels, ElementsAre(2, 3, 2));
  for (int i = 0; i < 3; ++i) {
    for (int p = 0; p < 12; ++p) {
      const float expected = dataset.pixels[indices[i] * 12 + p] / 255.f;
      EXPECT_NEAR(images[i * 12 + p], expected, 1e-6f) << i << " " << p;
    }
  }
  EXPECT_FLOAT_EQ(images[12], 0.f);          // sample 0, pixel 0
  EXPECT_FLOAT_EQ(images[11], 245.f / 255);  // sample 2, pixel 11: 35 * 7
}

TEST(GatherBatchTest, PerChannelMeanAndStd) {
  const Dataset dataset = SmallDataset();
  Normalization normalization;
  normalization.scale = 0.5f;
  normalization.mean = {10.f, -4.f};
  normalization.std = {2.f, 0.25f};
  std::vector<float> images(2 * 12);
  std::vector<int32_t> labels(2);
  const std::vector<int64_t> indices = {1, 0};
  ASSERT_TRUE(
      GatherBatch(dataset, indices, normalization, absl::MakeSpan(images), absl::MakeSpan(labels))
          .ok());
  for (int i = 0; i < 2; ++i) {
    for (int c = 0; c < 2; ++c) {
      for (int p = 0; p < 6; ++p) {
        const float x = dataset.pixels[indices[i] * 12 + c * 6 + p] * 0.5f;
        const float expected = (x - normalization.mean[c]) / normalization.std[c];
        EXPECT_NEAR(images[i * 12 + c * 6 + p], expected, 1e-5f * (1 + std::abs(expected)));
      }
    }
  }
  // Sample 1, channel 1, pixel 0 is byte 18 = 126: (63 + 4) / 0.25 = 268.
  EXPECT_FLOAT_EQ(images[6], 268.f);
}

TEST(GatherBatchTest, LongPlanesMatchTheFormula) {
  // Planes longer than the 16-pixel blocks and not a multiple of them.
  SyntheticOptions options;
  options.sample_shape = {3, 9, 7};
  options.size = 20;
  absl::StatusOr<Dataset> dataset = MakeSyntheticDataset(options);
  ASSERT_TRUE(dataset.ok());
  Normalization normalization;
  normalization.mean = {0.4f, 0.5f, 0.6f};
  normalization.std = {0.2f, 0.25f, 0.3f};
  const std::vector<int64_t> indices = {19, 3, 7, 7};
  std::vector<float> images(4 * 189);
  std::vector<int32_t> labels(4);
  ASSERT_TRUE(
      GatherBatch(*dataset, indices, normalization, absl::MakeSpan(images), absl::MakeSpan(labels))
          .ok());
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(labels[i], dataset->labels[indices[i]]);
    for (int c = 0; c < 3; ++c) {
      for (int p = 0; p < 63; ++p) {
        const float x = dataset->sample(indices[i])[c * 63 + p] / 255.f;
        const float expected = (x - normalization.mean[c]) / normalization.std[c];
        ASSERT_NEAR(images[i * 189 + c * 63 + p], expected, 1e-5f);
      }
    }
  }
}

TEST(GatherBatchTest, EmptyBatch) {
  EXPECT_TRUE(GatherBatch(SmallDataset(), {}, Normalization(), {}, {}).ok());
}

TEST(GatherBatchTest, ErrorsWriteNothing) {
  const Dataset dataset = SmallDataset();
  std::vector<float> images(2 * 12, -1.f);
  std::vector<int32_t> labels(2, -1);
  const auto gather = [&](std::vector<int64_t> indices, const Normalization& normalization) {
    return GatherBatch(dataset, indices, normalization, absl::MakeSpan(images),
                       absl::MakeSpan(labels));
  };
  absl::Status status = gather({0, 3}, Normalization());
  EXPECT_EQ(status.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(status.message(), HasSubstr("index 3 at position 1"));
  EXPECT_THAT(status.message(), HasSubstr("small"));
  EXPECT_EQ(gather({-1, 0}, Normalization()).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(gather({0}, Normalization()).code(), absl::StatusCode::kInvalidArgument);

  Normalization three_means;
  three_means.mean = {0.f, 0.f, 0.f};
  EXPECT_EQ(gather({0, 1}, three_means).code(), absl::StatusCode::kInvalidArgument);
  Normalization zero_std;
  zero_std.std = {1.f, 0.f};
  EXPECT_EQ(gather({0, 1}, zero_std).code(), absl::StatusCode::kInvalidArgument);
  Normalization nan_mean;
  nan_mean.mean = {NAN, 0.f};
  EXPECT_EQ(gather({0, 1}, nan_mean).code(), absl::StatusCode::kInvalidArgument);

  Normalization tiny_std;
  tiny_std.std = {1e-44f, 1.f};
  EXPECT_EQ(gather({0, 1}, tiny_std).code(), absl::StatusCode::kInvalidArgument);

  EXPECT_THAT(images, ::testing::Each(-1.f));
  EXPECT_THAT(labels, ::testing::Each(-1));

  Dataset broken = SmallDataset();
  broken.pixels.pop_back();
  EXPECT_EQ(GatherBatch(broken, std::vector<int64_t>{0, 1}, Normalization(), absl::MakeSpan(images),
                        absl::MakeSpan(labels))
                .code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(ComputeNormalizationTest, KnownValues) {
  Dataset dataset;
  dataset.name = "two_channels";
  dataset.sample_shape = {2, 1, 2};
  dataset.num_classes = 1;
  // Channel 0 sees 0, 255, 0, 255; channel 1 is constant 51.
  dataset.pixels = {0, 255, 51, 51, 255, 0, 51, 51};
  dataset.labels = {0, 0};
  absl::StatusOr<Normalization> normalization = ComputeNormalization(dataset);
  ASSERT_TRUE(normalization.ok()) << normalization.status();
  EXPECT_FLOAT_EQ(normalization->scale, 1.f / 255);
  EXPECT_THAT(normalization->mean, ElementsAre(::testing::FloatEq(0.5f), ::testing::FloatEq(0.2f)));
  EXPECT_THAT(normalization->std, ElementsAre(0.5f, 1.f));  // constant channel: std 1
}

TEST(ComputeNormalizationTest, NormalisedDataHasZeroMeanUnitStd) {
  SyntheticOptions options;
  options.sample_shape = {3, 8, 8};
  options.size = 200;
  absl::StatusOr<Dataset> dataset = MakeSyntheticDataset(options);
  ASSERT_TRUE(dataset.ok());
  absl::StatusOr<Normalization> normalization = ComputeNormalization(*dataset);
  ASSERT_TRUE(normalization.ok());
  std::vector<int64_t> all = EpochOrder(dataset->size(), 0, 0, false);
  std::vector<float> images(dataset->pixels.size());
  std::vector<int32_t> labels(dataset->size());
  ASSERT_TRUE(
      GatherBatch(*dataset, all, *normalization, absl::MakeSpan(images), absl::MakeSpan(labels))
          .ok());
  for (int c = 0; c < 3; ++c) {
    double sum = 0, sum_squares = 0;
    for (int64_t i = 0; i < dataset->size(); ++i) {
      for (int p = 0; p < 64; ++p) {
        const double x = images[i * 192 + c * 64 + p];
        sum += x;
        sum_squares += x * x;
      }
    }
    const double n = dataset->size() * 64.0;
    EXPECT_NEAR(sum / n, 0.0, 1e-4) << c;
    EXPECT_NEAR(sum_squares / n, 1.0, 1e-4) << c;
  }
}

TEST(ComputeNormalizationTest, EmptyDataset) {
  Dataset dataset = SmallDataset();
  dataset.pixels.clear();
  dataset.labels.clear();
  EXPECT_EQ(ComputeNormalization(dataset).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(LoadDatasetTest, UnknownNameListsKnownOnes) {
  absl::StatusOr<Dataset> dataset = LoadDataset("imagenet", "/nowhere", "train");
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(dataset.status().message(), HasSubstr("imagenet"));
  for (const char* known : {"cifar10", "fashion_mnist", "mnist", "synthetic"}) {
    EXPECT_THAT(dataset.status().message(), HasSubstr(known));
  }
}

TEST(LoadDatasetTest, Synthetic) {
  absl::StatusOr<Dataset> train = LoadDataset("synthetic", "", "train");
  absl::StatusOr<Dataset> test = LoadDataset("synthetic", "", "test");
  ASSERT_TRUE(train.ok()) << train.status();
  ASSERT_TRUE(test.ok()) << test.status();
  EXPECT_EQ(train->size(), 8192);
  EXPECT_EQ(test->size(), 2048);
  EXPECT_EQ(train->sample_shape, (Shape{1, 28, 28}));
  EXPECT_NE(std::vector<uint8_t>(train->pixels.begin(), train->pixels.begin() + 784),
            std::vector<uint8_t>(test->pixels.begin(), test->pixels.begin() + 784));
  EXPECT_EQ(LoadDataset("synthetic", "", "dev").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LoadDatasetTest, DispatchesToTheReaders) {
  const std::string dir = TestDir("loader_dispatch");
  WriteFile(dir + "/t10k-images-idx3-ubyte.gz", Gzip(IdxImages(2, 3, 3, PatternBytes(18, 0))));
  WriteFile(dir + "/t10k-labels-idx1-ubyte.gz", Gzip(IdxLabels(2, {5, 6})));
  for (const char* name : {"fashion_mnist", "mnist"}) {
    absl::StatusOr<Dataset> dataset = LoadDataset(name, dir, "test");
    ASSERT_TRUE(dataset.ok()) << dataset.status();
    EXPECT_EQ(dataset->name, name);
    EXPECT_THAT(dataset->labels, ElementsAre(5, 6));
  }
  absl::StatusOr<Dataset> missing = LoadDataset("fashion_mnist", dir, "train");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("train-images-idx3-ubyte.gz"));
  absl::StatusOr<Dataset> cifar = LoadDataset("cifar10", dir, "test");
  EXPECT_EQ(cifar.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(cifar.status().message(), HasSubstr("test_batch.bin"));
}

}  // namespace
}  // namespace ps::worker::data

namespace ps::worker::data {
namespace {

// A dataset whose sample i is known by its pixels (i's two bytes) and label.
Dataset Numbered(int64_t n) {
  Dataset d;
  d.name = "numbered";
  d.sample_shape = {1, 1, 2};
  d.num_classes = 10;
  for (int64_t i = 0; i < n; ++i) {
    d.pixels.push_back(static_cast<uint8_t>(i & 0xff));
    d.pixels.push_back(static_cast<uint8_t>(i >> 8));
    d.labels.push_back(static_cast<int32_t>(i % 10));
  }
  return d;
}

int64_t NumberOf(const Dataset& d, int64_t i) { return d.sample(i)[0] | (d.sample(i)[1] << 8); }

// The validation samples never appear in the training set, together they
// are all of it, each keeps its label, and the split is a function of the
// seed alone.
// Taking the dataset's memory gives the same split as copying it.
TEST(SplitHoldoutTest, InPlaceIsTheSameSplit) {
  const Dataset all = Numbered(1000);
  for (double fraction : {0.0, 0.1, 0.5}) {
    auto copied = SplitHoldout(all, fraction, 7);
    Dataset taken = all;
    const uint8_t* memory = taken.pixels.data();
    auto in_place = SplitHoldout(std::move(taken), fraction, 7);
    ASSERT_TRUE(copied.ok() && in_place.ok());
    EXPECT_EQ(in_place->train.pixels, copied->train.pixels) << fraction;
    EXPECT_EQ(in_place->train.labels, copied->train.labels) << fraction;
    EXPECT_EQ(in_place->validation.pixels, copied->validation.pixels) << fraction;
    EXPECT_EQ(in_place->validation.labels, copied->validation.labels) << fraction;
    EXPECT_EQ(in_place->validation.name, copied->validation.name);
    EXPECT_EQ(in_place->train.sample_shape, copied->train.sample_shape);
    EXPECT_EQ(in_place->train.pixels.data(), memory);  // not copied
    EXPECT_TRUE(ValidateDataset(in_place->train).ok());
  }
  Dataset refused = all;
  EXPECT_FALSE(SplitHoldout(std::move(refused), 1.0, 7).ok());
  EXPECT_EQ(refused.size(), 1000);  // untouched
}

TEST(SplitHoldoutTest, DisjointCompleteAndSeeded) {
  const Dataset all = Numbered(1000);
  auto split = SplitHoldout(all, 0.1, 7);
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ(split->validation.size(), 100);
  EXPECT_EQ(split->train.size(), 900);
  EXPECT_TRUE(ValidateDataset(split->train).ok());
  EXPECT_TRUE(ValidateDataset(split->validation).ok());
  std::vector<int> seen(1000, 0);
  for (const Dataset* d : {&split->train, &split->validation}) {
    for (int64_t i = 0; i < d->size(); ++i) {
      const int64_t number = NumberOf(*d, i);
      ++seen[number];
      EXPECT_EQ(d->labels[i], number % 10);
    }
  }
  for (int64_t i = 0; i < 1000; ++i) EXPECT_EQ(seen[i], 1) << i;
  // Not simply the last tenth, and the same again with the same seed only.
  int64_t last_tenth = 0;
  for (int64_t i = 0; i < 100; ++i) last_tenth += NumberOf(split->validation, i) >= 900;
  EXPECT_LT(last_tenth, 50);
  auto again = SplitHoldout(all, 0.1, 7);
  auto other = SplitHoldout(all, 0.1, 8);
  ASSERT_TRUE(again.ok() && other.ok());
  EXPECT_EQ(again->validation.pixels, split->validation.pixels);
  EXPECT_NE(other->validation.pixels, split->validation.pixels);
  // No hold-out, and fractions that make no sense.
  auto none = SplitHoldout(all, 0, 7);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->validation.size(), 0);
  EXPECT_EQ(none->train.pixels, all.pixels);
  for (double bad : {-0.1, 1.0, 2.0}) {
    EXPECT_EQ(SplitHoldout(all, bad, 7).status().code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(SplitHoldout(Numbered(1), 0.6, 7).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ps::worker::data
