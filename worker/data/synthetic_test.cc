#include "worker/data/synthetic.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::worker::data {
namespace {

Dataset Make(const SyntheticOptions& options) {
  absl::StatusOr<Dataset> dataset = MakeSyntheticDataset(options);
  EXPECT_TRUE(dataset.ok()) << dataset.status();
  return dataset.ok() ? *std::move(dataset) : Dataset{};
}

TEST(SyntheticTest, ShapeAndValidity) {
  SyntheticOptions options;
  options.sample_shape = {3, 10, 7};  // not a multiple of the 4-pixel blocks
  options.num_classes = 5;
  options.size = 300;
  const Dataset dataset = Make(options);
  EXPECT_EQ(dataset.name, "synthetic");
  EXPECT_EQ(dataset.sample_shape, (Shape{3, 10, 7}));
  EXPECT_EQ(dataset.num_classes, 5);
  EXPECT_EQ(dataset.size(), 300);
  EXPECT_TRUE(ValidateDataset(dataset).ok());
  std::vector<int> per_class(5, 0);
  for (int32_t label : dataset.labels) ++per_class[label];
  for (int count : per_class) EXPECT_GT(count, 30);  // 60 expected
}

TEST(SyntheticTest, DeterministicAndSeeded) {
  SyntheticOptions options;
  options.size = 64;
  const Dataset a = Make(options);
  const Dataset b = Make(options);
  EXPECT_EQ(a.pixels, b.pixels);
  EXPECT_EQ(a.labels, b.labels);
  options.seed = 1;
  const Dataset c = Make(options);
  EXPECT_NE(a.pixels, c.pixels);
}

TEST(SyntheticTest, GoldenValuesPinTheGenerator) {
  // Every machine must produce these bytes; a change here changes every
  // experiment that uses the synthetic data. (Cross-checked against an
  // independent Python implementation of SplitMix64 and this generator.)
  SyntheticOptions options;
  options.size = 4;
  const Dataset dataset = Make(options);
  EXPECT_EQ(dataset.labels, (std::vector<int32_t>{5, 3, 7, 9}));
  EXPECT_EQ(std::vector<int>(dataset.pixels.begin(), dataset.pixels.begin() + 8),
            (std::vector<int>{243, 139, 153, 170, 202, 233, 226, 173}));
}

TEST(SyntheticTest, SamplesDependOnIndexNotSize) {
  SyntheticOptions options;
  options.size = 100;
  const Dataset whole = Make(options);
  options.size = 40;
  options.first_index = 60;
  const Dataset tail = Make(options);
  EXPECT_EQ(std::vector<int32_t>(whole.labels.begin() + 60, whole.labels.end()), tail.labels);
  EXPECT_EQ(std::vector<uint8_t>(whole.pixels.begin() + 60 * 784, whole.pixels.end()), tail.pixels);
}

TEST(SyntheticTest, LearnableByNearestClassMean) {
  // Class means from one range of indices classify another range well: the
  // task carries signal a model can learn.
  SyntheticOptions options;
  options.size = 1000;
  const Dataset train = Make(options);
  options.size = 500;
  options.first_index = 1000000;
  const Dataset test = Make(options);
  const int64_t d = train.sample_elements();
  std::vector<double> means(10 * d, 0.0);
  std::vector<int> counts(10, 0);
  for (int64_t i = 0; i < train.size(); ++i) {
    ++counts[train.labels[i]];
    for (int64_t p = 0; p < d; ++p) means[train.labels[i] * d + p] += train.sample(i)[p];
  }
  for (int k = 0; k < 10; ++k) {
    for (int64_t p = 0; p < d; ++p) means[k * d + p] /= counts[k];
  }
  int correct = 0;
  for (int64_t i = 0; i < test.size(); ++i) {
    int best = -1;
    double best_distance = std::numeric_limits<double>::max();
    for (int k = 0; k < 10; ++k) {
      double distance = 0.0;
      for (int64_t p = 0; p < d; ++p) {
        const double diff = test.sample(i)[p] - means[k * d + p];
        distance += diff * diff;
      }
      if (distance < best_distance) {
        best_distance = distance;
        best = k;
      }
    }
    correct += best == test.labels[i];
  }
  EXPECT_GT(correct, 0.95 * test.size());
}

TEST(SyntheticTest, NoiseIsBoundedAndPresent) {
  SyntheticOptions options;
  options.size = 200;
  options.noise = 0;
  const Dataset clean = Make(options);
  options.noise = 10;
  const Dataset noisy = Make(options);
  EXPECT_EQ(clean.labels, noisy.labels);  // labels are drawn before the noise
  int max_diff = 0;
  bool any_diff = false;
  for (size_t p = 0; p < clean.pixels.size(); ++p) {
    const int diff = std::abs(int{clean.pixels[p]} - int{noisy.pixels[p]});
    max_diff = std::max(max_diff, diff);
    any_diff |= diff != 0;
  }
  EXPECT_TRUE(any_diff);
  EXPECT_LE(max_diff, 10);
}

TEST(SyntheticTest, InvalidOptions) {
  const auto code = [](SyntheticOptions options) {
    return MakeSyntheticDataset(options).status().code();
  };
  SyntheticOptions options;
  options.sample_shape = {28, 28};
  EXPECT_EQ(code(options), absl::StatusCode::kInvalidArgument);
  options = SyntheticOptions();
  options.sample_shape = {1, 0, 28};
  EXPECT_EQ(code(options), absl::StatusCode::kInvalidArgument);
  options = SyntheticOptions();
  options.num_classes = 0;
  EXPECT_EQ(code(options), absl::StatusCode::kInvalidArgument);
  options = SyntheticOptions();
  options.size = -1;
  EXPECT_EQ(code(options), absl::StatusCode::kInvalidArgument);
  options = SyntheticOptions();
  options.noise = 300;
  EXPECT_EQ(code(options), absl::StatusCode::kInvalidArgument);
  options = SyntheticOptions();
  options.size = int64_t{1} << 40;  // 784 TiB: refused, not attempted
  EXPECT_EQ(code(options), absl::StatusCode::kInvalidArgument);
  options = SyntheticOptions();
  options.size = 0;
  EXPECT_EQ(code(options), absl::StatusCode::kOk);
}

}  // namespace
}  // namespace ps::worker::data
