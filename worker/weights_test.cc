#include "worker/weights.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/cpu_device.h"
#include "common/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/testing/subprocess.h"
#include "worker/model/model.h"

namespace ps::worker {
namespace {

using ::testing::HasSubstr;


// fc1.weight [5, 16], fc1.bias [5], fc2.weight [3, 5], fc2.bias [3].
model::ModelConfig MlpConfig() {
  model::ModelConfig config;
  config.name = "mlp";
  config.input_shape = {1, 4, 4};
  config.num_classes = 3;
  config.mlp_hidden = {5};
  return config;
}

// Every parameter and buffer of `m`, in its flat layout.
std::vector<float> Contents(model::Model& m) {
  std::vector<float> values = *m.flat_parameters().ToVector();
  if (!m.buffers().empty()) {
    const std::vector<float> buffers = *m.flat_buffers().ToVector();
    values.insert(values.end(), buffers.begin(), buffers.end());
  }
  return values;
}

NamedHostTensor* FindTensor(std::vector<NamedHostTensor>& tensors, const std::string& name) {
  for (NamedHostTensor& t : tensors) {
    if (t.name == name) return &t;
  }
  ADD_FAILURE() << "no tensor " << name;
  return nullptr;
}

class WeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(Create(MlpConfig(), &model_).ok());
    ASSERT_TRUE(model_->Initialize(1).ok());
    before_ = Contents(*model_);
  }

  absl::Status Create(const model::ModelConfig& config, std::unique_ptr<model::Model>* out) {
    absl::StatusOr<std::unique_ptr<model::Model>> m = model::Model::Create(config, &device_);
    if (!m.ok()) return m.status();
    *out = std::move(*m);
    return absl::OkStatus();
  }

  // The tensors SaveWeights writes for an mlp initialised with another seed
  // than model_: a file model_ can load.
  std::vector<NamedHostTensor> GoodTensors() {
    std::unique_ptr<model::Model> other;
    EXPECT_TRUE(Create(MlpConfig(), &other).ok());
    EXPECT_TRUE(other->Initialize(2).ok());
    const std::string path = testing::TestTmpPath("good.safetensors");
    EXPECT_TRUE(SaveWeights(*other, path).ok());
    absl::StatusOr<SafetensorsFile> file = ReadSafetensors(path);
    EXPECT_TRUE(file.ok()) << file.status();
    return file.ok() ? file->tensors : std::vector<NamedHostTensor>{};
  }

  // Writes `tensors`, has LoadWeights refuse them with `code` and a message
  // naming the file and containing `problem`, and checks that model_ did not
  // change.
  void ExpectRefused(const std::vector<NamedHostTensor>& tensors, absl::StatusCode code,
                     const std::string& problem) {
    const std::string path = testing::TestTmpPath("refused.safetensors");
    ASSERT_TRUE(WriteSafetensors(path, tensors).ok());
    ExpectRefusedFile(path, code, problem);
  }

  void ExpectRefusedFile(const std::string& path, absl::StatusCode code,
                         const std::string& problem) {
    const absl::Status status = LoadWeights(path, *model_);
    EXPECT_EQ(status.code(), code) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(path));
    EXPECT_THAT(std::string(status.message()), HasSubstr(problem));
    EXPECT_EQ(Contents(*model_), before_) << "a refused load changed the model";
  }

  CpuDevice device_{0, 1};
  std::unique_ptr<model::Model> model_;
  std::vector<float> before_;  // model_'s contents after SetUp
};

TEST_F(WeightsTest, SaveThenLoadGivesTheSameValues) {
  const std::string path = testing::TestTmpPath("round_trip.safetensors");
  ASSERT_TRUE(SaveWeights(*model_, path).ok());

  std::unique_ptr<model::Model> other;
  ASSERT_TRUE(Create(MlpConfig(), &other).ok());
  ASSERT_TRUE(other->Initialize(99).ok());
  ASSERT_NE(Contents(*other), before_);
  const absl::Status status = LoadWeights(path, *other);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(Contents(*other), before_);

  // Saving what was loaded writes the same bytes: the file is a function of
  // the values alone.
  const std::string again = testing::TestTmpPath("round_trip_again.safetensors");
  ASSERT_TRUE(SaveWeights(*other, again).ok());
  EXPECT_EQ(testing::ReadFileBytes(again), testing::ReadFileBytes(path));
}

TEST_F(WeightsTest, SavedFileHasPyTorchNamesShapesAndMetadata) {
  const std::string path = testing::TestTmpPath("layout.safetensors");
  ASSERT_TRUE(SaveWeights(*model_, path).ok());
  absl::StatusOr<SafetensorsFile> file = ReadSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata,
            (std::map<std::string, std::string>{{"format", "pt"}, {"model", "mlp"}}));
  const std::map<std::string, Shape> want = {
      {"fc1.weight", {5, 16}}, {"fc1.bias", {5}}, {"fc2.weight", {3, 5}}, {"fc2.bias", {3}}};
  std::map<std::string, Shape> got;
  for (const NamedHostTensor& t : file->tensors) {
    EXPECT_EQ(t.dtype, SafetensorsDType::kF32) << t.name;
    got[t.name] = t.shape;
  }
  EXPECT_EQ(got, want);
  // Each tensor holds the model's values for its name.
  for (const NamedHostTensor& t : file->tensors) {
    absl::StatusOr<Tensor> view = model_->Find(t.name);
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_EQ(*t.ToFloats(), *view->ToVector()) << t.name;
  }
}

// The file the refusal tests edit loads as it is, so each refusal below is
// the edit's doing.
TEST_F(WeightsTest, TheUneditedFileLoads) {
  const std::string path = testing::TestTmpPath("unedited.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, GoodTensors()).ok());
  const absl::Status status = LoadWeights(path, *model_);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_NE(Contents(*model_), before_);
}

TEST_F(WeightsTest, RefusesAMissingTensor) {
  std::vector<NamedHostTensor> tensors = GoodTensors();
  tensors.erase(std::remove_if(tensors.begin(), tensors.end(),
                               [](const NamedHostTensor& t) { return t.name == "fc2.bias"; }),
                tensors.end());
  ASSERT_EQ(tensors.size(), 3u);
  ExpectRefused(tensors, absl::StatusCode::kInvalidArgument,
                "no tensor 'fc2.bias', which model 'mlp' needs");
}

TEST_F(WeightsTest, RefusesAWrongName) {
  std::vector<NamedHostTensor> tensors = GoodTensors();
  FindTensor(tensors, "fc2.weight")->name = "fc2.weights";
  // The model's name is what is missing.
  ExpectRefused(tensors, absl::StatusCode::kInvalidArgument, "no tensor 'fc2.weight'");
}

TEST_F(WeightsTest, RefusesAnUnexpectedTensor) {
  std::vector<NamedHostTensor> tensors = GoodTensors();
  tensors.push_back(*NamedHostTensor::FromFloats("fc3.bias", {3}, {1.f, 2.f, 3.f}));
  ExpectRefused(tensors, absl::StatusCode::kInvalidArgument,
                "unexpected tensor 'fc3.bias' for model 'mlp'");
}

TEST_F(WeightsTest, RefusesAWrongShape) {
  std::vector<NamedHostTensor> tensors = GoodTensors();
  // Transposed: the right number of elements, the wrong layout.
  FindTensor(tensors, "fc1.weight")->shape = {16, 5};
  ExpectRefused(tensors, absl::StatusCode::kInvalidArgument,
                "tensor 'fc1.weight' has shape [16, 5] but model 'mlp' needs [5, 16]");

  tensors = GoodTensors();
  NamedHostTensor* bias = FindTensor(tensors, "fc2.bias");
  *bias = *NamedHostTensor::FromFloats("fc2.bias", {4}, {1.f, 2.f, 3.f, 4.f});
  ExpectRefused(tensors, absl::StatusCode::kInvalidArgument,
                "tensor 'fc2.bias' has shape [4] but model 'mlp' needs [3]");

  tensors = GoodTensors();
  *FindTensor(tensors, "fc2.bias") = *NamedHostTensor::FromFloats("fc2.bias", {}, {1.f});
  ExpectRefused(tensors, absl::StatusCode::kInvalidArgument,
                "tensor 'fc2.bias' has shape [] but model 'mlp' needs [3]");
}

TEST_F(WeightsTest, RefusesAWrongDType) {
  std::vector<NamedHostTensor> tensors = GoodTensors();
  NamedHostTensor* bias = FindTensor(tensors, "fc1.bias");
  // Five F16 ones: convertible, but only F32 is loaded.
  *bias = {"fc1.bias", SafetensorsDType::kF16, {5}, std::vector<uint8_t>(10, 0)};
  for (int i = 0; i < 5; ++i) bias->data[2 * i + 1] = 0x3C;
  ExpectRefused(tensors, absl::StatusCode::kInvalidArgument,
                "tensor 'fc1.bias' is F16; F32 is needed");

  tensors = GoodTensors();
  *FindTensor(tensors, "fc2.bias") = *NamedHostTensor::FromInt64s("fc2.bias", {3}, {1, 2, 3});
  ExpectRefused(tensors, absl::StatusCode::kInvalidArgument,
                "tensor 'fc2.bias' is I64; F32 is needed");
}

TEST_F(WeightsTest, RefusesAFileWithNoTensors) {
  ExpectRefused({}, absl::StatusCode::kInvalidArgument,
                "no tensor 'fc1.weight', which model 'mlp' needs");
}

TEST_F(WeightsTest, FileErrorsNameTheFile) {
  ExpectRefusedFile(testing::TestTmpPath("no_such.safetensors"), absl::StatusCode::kNotFound, "no such file");

  const std::string garbage = testing::TestTmpPath("garbage.safetensors");
  {
    std::ofstream out(garbage, std::ios::binary | std::ios::trunc);
    const std::string header = "{\"fc1.weight\":[[[[";
    std::string length(8, '\0');
    length[0] = static_cast<char>(header.size());
    out << length << header;
  }
  ExpectRefusedFile(garbage, absl::StatusCode::kInvalidArgument,
                    "expected an object for tensor 'fc1.weight'");
}

// Batch norm's num_batches_tracked: PyTorch saves an I64 scalar; files
// written before it was a scalar here hold an F32 [1]. Both load; a counter
// of another size does not.
TEST_F(WeightsTest, BatchNormCountersLoadAsI64ScalarsOrF32) {
  model::ModelConfig config;
  config.name = "resnet18";
  config.input_shape = {3, 32, 32};
  std::unique_ptr<model::Model> resnet;
  ASSERT_TRUE(Create(config, &resnet).ok());
  ASSERT_TRUE(resnet->Initialize(3).ok());
  const std::string counter = "b1.bn.num_batches_tracked";
  ASSERT_TRUE(resnet->Find(counter).ok());

  const std::string path = testing::TestTmpPath("resnet.safetensors");
  ASSERT_TRUE(SaveWeights(*resnet, path).ok());
  absl::StatusOr<SafetensorsFile> file = ReadSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const NamedHostTensor* saved = *file->Find(counter);
  EXPECT_EQ(saved->dtype, SafetensorsDType::kI64);
  EXPECT_EQ(saved->shape, Shape{});

  std::vector<NamedHostTensor> tensors = file->tensors;
  *FindTensor(tensors, counter) = *NamedHostTensor::FromInt64s(counter, {}, {42});
  ASSERT_TRUE(WriteSafetensors(path, tensors).ok());
  absl::Status status = LoadWeights(path, *resnet);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(*resnet->Find(counter)->ToVector(), std::vector<float>{42.f});

  *FindTensor(tensors, counter) = *NamedHostTensor::FromFloats(counter, {1}, {7.f});
  ASSERT_TRUE(WriteSafetensors(path, tensors).ok());
  status = LoadWeights(path, *resnet);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(*resnet->Find(counter)->ToVector(), std::vector<float>{7.f});

  *FindTensor(tensors, counter) = *NamedHostTensor::FromInt64s(counter, {2}, {1, 2});
  ASSERT_TRUE(WriteSafetensors(path, tensors).ok());
  status = LoadWeights(path, *resnet);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("tensor '" + counter + "' has shape [2] but model 'resnet18' needs []"));
  EXPECT_EQ(*resnet->Find(counter)->ToVector(), std::vector<float>{7.f});
}

}  // namespace
}  // namespace ps::worker
