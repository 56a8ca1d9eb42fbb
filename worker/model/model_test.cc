#include "worker/model/model.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/cpu_device.h"
#include "common/devices.h"
#include "gtest/gtest.h"
#include "worker/model/test_util.h"

namespace ps::worker::model {
namespace {

using ::ps::worker::model::testing::DeviceLabels;
using ::ps::worker::model::testing::DeviceTensor;
using ::ps::worker::model::testing::GradientsClose;
using ::ps::worker::model::testing::HostValues;
using ::ps::worker::model::testing::ReadDeviceFloat;
using ::ps::worker::model::testing::Uniform;

ModelConfig Config(std::string name, Shape input_shape, int64_t classes,
                   std::vector<int64_t> hidden = {256}) {
  ModelConfig config;
  config.name = std::move(name);
  config.input_shape = std::move(input_shape);
  config.num_classes = classes;
  config.mlp_hidden = std::move(hidden);
  return config;
}

std::unique_ptr<Model> MakeModel(const ModelConfig& config, Device* device, uint64_t seed) {
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Create(config, device);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return nullptr;
  absl::Status s = (*model)->Initialize(seed);
  EXPECT_TRUE(s.ok()) << s;
  return *std::move(model);
}

// The batch torch_models.py's golden_batch builds: x[i] = float((i * 37) %
// 101) / 50 - 1, labels[i] = (i * 3) % classes.
std::vector<float> GoldenInputs(int64_t count) {
  std::vector<float> x(count);
  for (int64_t i = 0; i < count; ++i) {
    x[i] = static_cast<float>((i * 37) % 101) / 50.0f - 1.0f;
  }
  return x;
}

std::vector<int32_t> GoldenLabels(int64_t n, int64_t classes) {
  std::vector<int32_t> labels(n);
  for (int64_t i = 0; i < n; ++i) labels[i] = static_cast<int32_t>((i * 3) % classes);
  return labels;
}

Shape BatchShape(const ModelConfig& config, int64_t n) {
  Shape shape = {n};
  shape.insert(shape.end(), config.input_shape.begin(), config.input_shape.end());
  return shape;
}

struct Metrics {
  float loss_sum;
  float correct;
};

Metrics Read(Device* device, const DeviceMetrics& m) {
  return {ReadDeviceFloat(device, m.loss_sum), ReadDeviceFloat(device, m.correct)};
}

// A training step's metrics; the gradients are in model.flat_gradients().
Metrics Step(Model& model, const Tensor& x, const Tensor& labels) {
  absl::StatusOr<DeviceMetrics> m = model.ForwardBackward(x, labels);
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return {NAN, NAN};
  return Read(model.device(), *m);
}

Metrics Eval(Model& model, const Tensor& x, const Tensor& labels) {
  absl::StatusOr<DeviceMetrics> m = model.Evaluate(x, labels);
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return {NAN, NAN};
  return Read(model.device(), *m);
}

std::string TestDataPath(const std::string& file) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  const std::string relative = "worker/model/testdata/" + file;
  if (srcdir == nullptr || workspace == nullptr) return relative;
  return absl::StrCat(srcdir, "/", workspace, "/", relative);
}

std::vector<std::vector<std::string>> ReadRecords(const std::string& file) {
  std::ifstream in(TestDataPath(file));
  EXPECT_TRUE(in.good()) << "cannot open " << TestDataPath(file);
  std::vector<std::vector<std::string>> records;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    records.push_back(absl::StrSplit(line, ' ', absl::SkipEmpty()));
  }
  return records;
}

std::vector<int64_t> ParseInts(const std::string& text) {
  std::vector<int64_t> values;
  if (text == "-") return values;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t v = 0;
    EXPECT_TRUE(absl::SimpleAtoi(part, &v)) << text;
    values.push_back(v);
  }
  return values;
}

double ParseDouble(const std::string& text) {
  double v = 0;
  EXPECT_TRUE(absl::SimpleAtod(text, &v)) << text;
  return v;
}

class ModelTest : public ::testing::Test {
 protected:
  CpuDevice device_{0, 2};
  Device* cpu() { return &device_; }
};

// --- signatures: names, shapes, counts ---

TEST_F(ModelTest, ParameterCountsMatchTorch) {
  struct Expected {
    ModelConfig config;
    size_t tensors;
    int64_t parameters;
    size_t buffer_tensors;
    int64_t buffer_elements;
  };
  // From `torch_models.py --count` (torch 1.13).
  const Expected cases[] = {
      {Config("softmax", {1, 28, 28}, 10), 2, 7850, 0, 0},
      {Config("mlp", {1, 28, 28}, 10), 4, 203530, 0, 0},
      {Config("lenet", {1, 28, 28}, 10), 10, 61706, 0, 0},
      {Config("lenet_relu", {1, 28, 28}, 10), 10, 61706, 0, 0},
      {Config("resnet18", {1, 28, 28}, 10), 76, 11178378, 51, 7825},
      {Config("resnet18", {3, 32, 32}, 10), 76, 11184650, 51, 7825},
      {Config("resnet18_cifar", {1, 28, 28}, 10), 76, 11175818, 51, 7825},
      {Config("resnet18_cifar", {3, 32, 32}, 10), 76, 11176970, 51, 7825},
  };
  for (const Expected& e : cases) {
    auto model = Model::Create(e.config, cpu());
    ASSERT_TRUE(model.ok()) << model.status();
    const std::string what = e.config.name + " " + ShapeToString(e.config.input_shape);
    EXPECT_EQ((*model)->parameters().size(), e.tensors) << what;
    EXPECT_EQ(TotalElements((*model)->parameters()), e.parameters) << what;
    EXPECT_EQ((*model)->flat_parameters().num_elements(), e.parameters) << what;
    EXPECT_EQ((*model)->flat_gradients().num_elements(), e.parameters) << what;
    EXPECT_EQ((*model)->buffers().size(), e.buffer_tensors) << what;
    EXPECT_EQ((*model)->flat_buffers().num_elements(), e.buffer_elements) << what;
  }
}

TEST_F(ModelTest, LeNetNamesAndShapes) {
  auto model = Model::Create(Config("lenet", {1, 28, 28}, 10), cpu());
  ASSERT_TRUE(model.ok());
  const std::vector<ParamSpec> expected = {
      {"conv1.weight", {6, 1, 5, 5}},  {"conv1.bias", {6}},
      {"conv2.weight", {16, 6, 5, 5}}, {"conv2.bias", {16}},
      {"fc1.weight", {120, 400}},      {"fc1.bias", {120}},
      {"fc2.weight", {84, 120}},       {"fc2.bias", {84}},
      {"fc3.weight", {10, 84}},        {"fc3.bias", {10}},
  };
  EXPECT_EQ((*model)->parameters(), expected);
  EXPECT_TRUE((*model)->buffers().empty());
}

// Every key, shape and order equals the torch.nn model's state_dict, as
// written by torch_models.py into testdata/torch_specs.txt.
TEST_F(ModelTest, NamesShapesAndOrderMatchTorchStateDict) {
  const auto records = ReadRecords("torch_specs.txt");
  ASSERT_FALSE(records.empty());
  std::unique_ptr<Model> model;
  size_t p = 0, b = 0;
  auto finish = [&]() {
    if (model == nullptr) return;
    EXPECT_EQ(p, model->parameters().size()) << model->config().name;
    EXPECT_EQ(b, model->buffers().size()) << model->config().name;
  };
  int configs = 0;
  for (const auto& r : records) {
    if (r[0] == "config") {
      finish();
      ASSERT_EQ(r.size(), 5u);
      auto created =
          Model::Create(Config(r[1], ParseInts(r[2]), ParseInts(r[3])[0], ParseInts(r[4])), cpu());
      ASSERT_TRUE(created.ok()) << created.status();
      model = *std::move(created);
      p = b = 0;
      ++configs;
      continue;
    }
    ASSERT_NE(model, nullptr);
    ASSERT_EQ(r.size(), 3u);
    const std::vector<ParamSpec>& specs = r[0] == "P" ? model->parameters() : model->buffers();
    size_t& i = r[0] == "P" ? p : b;
    ASSERT_LT(i, specs.size()) << model->config().name << ": extra torch key " << r[1];
    EXPECT_EQ(specs[i].name, r[1]) << model->config().name << " #" << i;
    EXPECT_EQ(specs[i].shape, ParseInts(r[2])) << r[1];
    EXPECT_EQ(specs[i].dtype, DType::kF32) << r[1];
    EXPECT_TRUE(model->Find(r[1]).ok()) << r[1];
    ++i;
  }
  finish();
  EXPECT_EQ(configs, 9);
}

// --- configuration and input errors ---

TEST_F(ModelTest, CreateRejectsBadConfigurations) {
  auto unknown = Model::Create(Config("vgg", {1, 28, 28}, 10), cpu());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("vgg"), std::string::npos) << unknown.status();
  EXPECT_NE(unknown.status().message().find("resnet18_cifar"), std::string::npos)
      << unknown.status();

  auto lenet = Model::Create(Config("lenet", {1, 32, 32}, 10), cpu());
  EXPECT_EQ(lenet.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(lenet.status().message().find("lenet"), std::string::npos) << lenet.status();
  EXPECT_NE(lenet.status().message().find("[1, 32, 32]"), std::string::npos) << lenet.status();

  EXPECT_FALSE(Model::Create(Config("lenet", {1, 8, 8}, 10), cpu()).ok());
  EXPECT_FALSE(Model::Create(Config("resnet18", {28, 28}, 10), cpu()).ok());
  EXPECT_FALSE(Model::Create(Config("softmax", {1, 28, 28}, 0), cpu()).ok());
  EXPECT_FALSE(Model::Create(Config("mlp", {1, 28, 28}, 10, {64, 0}), cpu()).ok());
  EXPECT_TRUE(Model::Create(Config("lenet", {3, 28, 28}, 10), cpu()).ok());
  EXPECT_TRUE(Model::Create(Config("resnet18", {3, 32, 32}, 100), cpu()).ok());
  EXPECT_FALSE(Model::Create(Config("resnet18_cifar", {28, 28}, 10), cpu()).ok());
  EXPECT_TRUE(Model::Create(Config("resnet18_cifar", {3, 32, 32}, 100), cpu()).ok());
}

TEST_F(ModelTest, StepRejectsBadBatches) {
  const ModelConfig config = Config("lenet", {1, 28, 28}, 10);
  auto model = MakeModel(config, cpu(), 1);
  ASSERT_NE(model, nullptr);
  Tensor labels = DeviceLabels(cpu(), std::vector<int32_t>{1, 2});
  Tensor wrong = DeviceTensor(cpu(), {2, 1, 28, 27}, Uniform(2 * 28 * 27, 1));
  auto status = model->ForwardBackward(wrong, labels).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("lenet"), std::string::npos) << status;
  EXPECT_NE(status.message().find("[2, 1, 28, 27]"), std::string::npos) << status;
  EXPECT_FALSE(model->Evaluate(wrong, labels).ok());

  Tensor x = DeviceTensor(cpu(), {2, 1, 28, 28}, Uniform(2 * 784, 1));
  Tensor float_labels = DeviceTensor(cpu(), {2}, {1, 2});
  EXPECT_EQ(model->ForwardBackward(x, float_labels).status().code(),
            absl::StatusCode::kInvalidArgument);
  Tensor three_labels = DeviceLabels(cpu(), std::vector<int32_t>{1, 2, 3});
  EXPECT_EQ(model->ForwardBackward(x, three_labels).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(model->ForwardBackward(x, labels).ok());
}

// --- initialisation ---

TEST_F(ModelTest, InitializeIsDeterministic) {
  for (const char* name : {"lenet", "resnet18", "resnet18_cifar"}) {
    const ModelConfig config = Config(name, {1, 28, 28}, 10);
    auto a = MakeModel(config, cpu(), 7);
    auto b = MakeModel(config, cpu(), 7);
    auto c = MakeModel(config, cpu(), 8);
    ASSERT_TRUE(a && b && c);
    EXPECT_EQ(HostValues(a->flat_parameters()), HostValues(b->flat_parameters())) << name;
    EXPECT_EQ(HostValues(a->flat_buffers()), HostValues(b->flat_buffers())) << name;
    EXPECT_NE(HostValues(a->flat_parameters()), HostValues(c->flat_parameters())) << name;
    // Gradients start at zero, before any step.
    for (float g : HostValues(a->flat_gradients())) ASSERT_EQ(g, 0.0f);
  }
}

// --- agreement with torch (testdata/torch_golden.txt) ---

// A checksum triple (sum, weighted sum, abs sum) as torch_models.py computes.
struct Checksums {
  double sum = 0, weighted = 0, abs = 0;
};

Checksums Compute(absl::Span<const float> v) {
  Checksums c;
  for (size_t i = 0; i < v.size(); ++i) {
    c.sum += v[i];
    c.weighted += v[i] * static_cast<double>(static_cast<int64_t>(i % 7) - 3);
    c.abs += std::fabs(v[i]);
  }
  return c;
}

// Sums may cancel, so their tolerance scales with the abs sum.
void ExpectChecksums(const std::string& what, const Checksums& actual,
                     const std::vector<std::string>& record, double rtol) {
  const double sum = ParseDouble(record[2]), weighted = ParseDouble(record[3]),
               abs = ParseDouble(record[4]);
  const double tol = rtol * abs + 1e-6;
  EXPECT_NEAR(actual.sum, sum, tol) << what << " sum";
  EXPECT_NEAR(actual.weighted, weighted, tol) << what << " weighted sum";
  EXPECT_NEAR(actual.abs, abs, tol) << what << " abs sum";
}

// Whether a model is one of the two ResNet-18s (the same body, other stems).
bool IsResNet18(const std::string& model) {
  return model == "resnet18" || model == "resnet18_cifar";
}

// Whether `name` is the bias of a convolution followed by batch norm.
bool FeedsBatchNorm(const std::string& model, const std::string& name) {
  if (!IsResNet18(model)) return false;
  for (const char* suffix : {".conv.bias", ".conv1.bias", ".conv2.bias"}) {
    const std::string s = suffix;
    if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) {
      return true;
    }
  }
  return false;
}

// Same initial weights as torch_models.init_from_seed (bit for bit), then one
// training step and one evaluation: loss, accuracy, every gradient and every
// updated batch-norm buffer agree with torch.nn.
TEST_F(ModelTest, OneStepMatchesTorch) {
  const auto records = ReadRecords("torch_golden.txt");
  ASSERT_FALSE(records.empty());
  std::unique_ptr<Model> model;
  ModelConfig config;
  Tensor x, labels;
  std::map<std::string, std::vector<float>> grads, params, buffers;
  float train_correct = -1, eval_correct = -1;
  int configs = 0;
  for (const auto& r : records) {
    if (r[0] == "config") {
      ASSERT_EQ(r.size(), 7u);
      config = Config(r[1], ParseInts(r[2]), ParseInts(r[3])[0], ParseInts(r[4]));
      const int64_t batch = ParseInts(r[5])[0];
      model = MakeModel(config, cpu(), ParseInts(r[6])[0]);
      ASSERT_NE(model, nullptr);
      x = DeviceTensor(cpu(), BatchShape(config, batch),
                       GoldenInputs(batch * NumElements(config.input_shape)));
      labels = DeviceLabels(cpu(), GoldenLabels(batch, config.num_classes));
      params.clear();
      for (const ParamSpec& spec : model->parameters()) {
        params[spec.name] = HostValues(*model->Find(spec.name));
      }
      ++configs;
      continue;
    }
    ASSERT_NE(model, nullptr);
    const std::string what = config.name + " " + r[0] + (r.size() > 2 ? " " + r[1] : "");
    // ResNet's deeper fp32 arithmetic, summed in other orders, drifts more.
    const double rtol = IsResNet18(config.name) ? 2e-3 : 2e-4;
    if (r[0] == "param") {
      // Bit-identical initial weights: only the double summation may differ.
      ExpectChecksums(what, Compute(params.at(r[1])), r, 1e-12);
    } else if (r[0] == "train_loss_sum") {
      const Metrics m = Step(*model, x, labels);
      EXPECT_NEAR(m.loss_sum, ParseDouble(r[1]), 1e-4 * ParseDouble(r[1])) << what;
      grads.clear();
      const std::vector<float> flat = HostValues(model->flat_gradients());
      int64_t offset = 0;
      for (const ParamSpec& spec : model->parameters()) {
        const int64_t n = NumElements(spec.shape);
        grads[spec.name].assign(flat.begin() + offset, flat.begin() + offset + n);
        offset += n;
      }
      buffers.clear();
      for (const ParamSpec& spec : model->buffers()) {
        buffers[spec.name] = HostValues(*model->Find(spec.name));
      }
      train_correct = m.correct;
    } else if (r[0] == "train_correct") {
      EXPECT_EQ(train_correct, ParseDouble(r[1])) << what;
    } else if (r[0] == "grad") {
      if (FeedsBatchNorm(config.name, r[1])) {
        // Batch norm subtracts the channel mean, so a bias just before it
        // has gradient 0: torch's and ours are both rounding noise.
        EXPECT_LT(Compute(grads.at(r[1])).abs, 1e-2) << what;
      } else {
        ExpectChecksums(what, Compute(grads.at(r[1])), r, rtol);
      }
    } else if (r[0] == "buffer") {
      ExpectChecksums(what, Compute(buffers.at(r[1])), r, rtol);
    } else if (r[0] == "eval_loss_sum") {
      const Metrics m = Eval(*model, x, labels);
      EXPECT_NEAR(m.loss_sum, ParseDouble(r[1]), 10 * rtol * ParseDouble(r[1])) << what;
      eval_correct = m.correct;
    } else if (r[0] == "eval_correct") {
      EXPECT_EQ(eval_correct, ParseDouble(r[1])) << what;
    } else {
      FAIL() << "unknown record " << r[0];
    }
  }
  EXPECT_EQ(configs, 6);
}

// --- finite differences on whole models ---

struct FdOptions {
  double eps = 1e-2;
  double rtol = 2e-2;
  // Absolute tolerance as a fraction of the largest |gradient|.
  double atol_fraction = 2e-3;
  // Elements checked per parameter tensor besides its largest-|g| one; -1
  // checks every element.
  int per_tensor = -1;
};

// Compares flat_gradients() after a training step with central differences
// of the step's summed loss (recomputed by ForwardBackward, whose training-
// mode forward is the function differentiated), per parameter element, and
// along one random direction through all parameters at once.
void CheckModelGradients(Model& model, const Tensor& x, const Tensor& labels,
                         const FdOptions& opt) {
  Step(model, x, labels);
  const std::vector<float> grads = HostValues(model.flat_gradients());
  std::vector<float> p = HostValues(model.flat_parameters());
  double max_grad = 0;
  for (float g : grads) max_grad = std::max(max_grad, std::fabs(double(g)));
  ASSERT_GT(max_grad, 0);
  const double atol = opt.atol_fraction * max_grad;

  auto loss_at = [&](const std::vector<float>& values) -> double {
    EXPECT_TRUE(model.flat_parameters().CopyFromHost(values).ok());
    return Step(model, x, labels).loss_sum;
  };

  int64_t offset = 0;
  for (const ParamSpec& spec : model.parameters()) {
    const int64_t n = NumElements(spec.shape);
    std::vector<int64_t> idx;
    if (opt.per_tensor < 0) {
      for (int64_t i = 0; i < n; ++i) idx.push_back(i);
    } else {
      int64_t top = 0;
      for (int64_t i = 1; i < n; ++i) {
        if (std::fabs(grads[offset + i]) > std::fabs(grads[offset + top])) top = i;
      }
      idx.push_back(top);
      for (int k = 0; k < opt.per_tensor; ++k) {
        idx.push_back((k * 7919 + 13) % n);
      }
    }
    std::vector<double> analytic, numeric;
    for (int64_t i : idx) {
      const int64_t j = offset + i;
      const float saved = p[j];
      p[j] = saved + static_cast<float>(opt.eps);
      const double plus = loss_at(p);
      p[j] = saved - static_cast<float>(opt.eps);
      const double minus = loss_at(p);
      p[j] = saved;
      numeric.push_back((plus - minus) / (2 * opt.eps));
      analytic.push_back(grads[j]);
    }
    EXPECT_TRUE(
        GradientsClose(model.config().name + " d" + spec.name, analytic, numeric, opt.rtol, atol));
    offset += n;
  }

  // Directional derivative along the gradient's own direction v = g / |g|:
  // if g is right, the loss changes at rate |g| there; a step of length eps
  // moves the parameters along it.
  double norm = 0;
  for (float g : grads) norm += double(g) * g;
  norm = std::sqrt(norm);
  std::vector<float> plus = p, minus = p;
  for (size_t j = 0; j < p.size(); ++j) {
    const double step = opt.eps * grads[j] / norm;
    plus[j] = static_cast<float>(p[j] + step);
    minus[j] = static_cast<float>(p[j] - step);
  }
  const double numeric = (loss_at(plus) - loss_at(minus)) / (2 * opt.eps);
  EXPECT_NEAR(numeric, norm, opt.rtol * norm)
      << model.config().name << " directional derivative along the gradient";
  ASSERT_TRUE(model.flat_parameters().CopyFromHost(p).ok());
}

void CheckModel(Device* device, const ModelConfig& config, int64_t batch, const FdOptions& opt) {
  auto model = MakeModel(config, device, 3);
  ASSERT_NE(model, nullptr);
  const int64_t count = batch * NumElements(config.input_shape);
  Tensor x = DeviceTensor(device, BatchShape(config, batch), Uniform(count, 17));
  std::vector<int32_t> labels(batch);
  for (int64_t i = 0; i < batch; ++i)
    labels[i] = static_cast<int32_t>((5 * i + 1) % config.num_classes);
  CheckModelGradients(*model, x, DeviceLabels(device, labels), opt);
}

TEST_F(ModelTest, SoftmaxGradients) {
  CheckModel(cpu(), Config("softmax", {1, 4, 4}, 3), 3, FdOptions());
}

TEST_F(ModelTest, MlpGradients) {
  FdOptions opt;
  opt.eps = 1e-3;
  CheckModel(cpu(), Config("mlp", {2, 3, 3}, 3, {6, 5}), 3, opt);
}

TEST_F(ModelTest, LeNetGradients) {
  FdOptions opt;
  opt.per_tensor = 6;
  CheckModel(cpu(), Config("lenet", {1, 28, 28}, 10), 2, opt);
}

// ReLU and max pooling are piecewise linear: over 2 x 6 x 28 x 28 units a
// step of 1e-3 already crosses enough kinks (and max-pooling switches) to
// bend conv1's and conv2's difference quotients by 10%. A step of 3e-4 keeps
// clear of most, but then the fp32 rounding of the loss (~1e-6) makes the
// quotients uncertain by ~2e-3, hence an absolute tolerance of 1% of the
// largest gradient. OneStepMatchesTorch pins these gradients much tighter.
TEST_F(ModelTest, LeNetReluGradients) {
  FdOptions opt;
  opt.eps = 3e-4;
  opt.atol_fraction = 1e-2;
  opt.per_tensor = 6;
  CheckModel(cpu(), Config("lenet_relu", {1, 28, 28}, 10), 2, opt);
}

// Batch norm over few values is steep (a channel whose inputs nearly agree
// across the batch is divided by a tiny deviation), so finite differences
// need enough values per channel: 1x32x32 inputs leave 1x1 planes in stage
// 4, and a batch of 8 makes that 8 values. eps is small against the weights
// (Xavier bounds 0.02..0.04). The largest-|g| element of every tensor is
// checked, and the directional derivative along the whole gradient.
FdOptions ResNetFdOptions() {
  FdOptions opt;
  opt.eps = 1e-3;
  opt.rtol = 5e-2;
  opt.atol_fraction = 1e-2;
  opt.per_tensor = 0;
  return opt;
}

TEST_F(ModelTest, ResNet18Gradients) {
  CheckModel(cpu(), Config("resnet18", {1, 32, 32}, 10), 8, ResNetFdOptions());
}

// The same body behind the 3x3/1 stem without pooling. 4x4 inputs keep the
// stem's and stage 1's planes larger than one pixel and stages 3 and 4 at
// 1x1 (8 values a channel, as above); 8x8 ones checked the same in 7 s
// instead of 5, most of either spent on the 11 M weights, not the planes.
TEST_F(ModelTest, ResNet18CifarGradients) {
  CheckModel(cpu(), Config("resnet18_cifar", {1, 4, 4}, 10), 8, ResNetFdOptions());
}

// --- batch sizes, evaluation ---

// The summed loss and its gradients add up over a split batch (no batch
// norm), and the batch size may shrink and grow between steps.
TEST_F(ModelTest, BatchSizeChangesAndShardsAddUp) {
  const ModelConfig config = Config("lenet_relu", {1, 28, 28}, 10);
  auto model = MakeModel(config, cpu(), 11);
  ASSERT_NE(model, nullptr);
  const std::vector<float> x = Uniform(4 * 784, 5);
  const std::vector<int32_t> labels = {3, 1, 4, 1};
  auto batch = [&](int64_t begin, int64_t n) {
    return std::make_pair(
        DeviceTensor(cpu(), {n, 1, 28, 28}, absl::MakeConstSpan(x.data() + begin * 784, n * 784)),
        DeviceLabels(cpu(), absl::MakeConstSpan(labels.data() + begin, n)));
  };
  auto [x4, l4] = batch(0, 4);
  const float loss4 = Step(*model, x4, l4).loss_sum;
  const std::vector<float> g4 = HostValues(model->flat_gradients());
  auto [xa, la] = batch(0, 1);
  const float loss_a = Step(*model, xa, la).loss_sum;
  const std::vector<float> ga = HostValues(model->flat_gradients());
  auto [xb, lb] = batch(1, 3);
  const float loss_b = Step(*model, xb, lb).loss_sum;
  const std::vector<float> gb = HostValues(model->flat_gradients());
  EXPECT_NEAR(loss_a + loss_b, loss4, 1e-5 * loss4);
  double max_g = 0, max_err = 0;
  for (size_t i = 0; i < g4.size(); ++i) {
    max_g = std::max(max_g, std::fabs(double(g4[i])));
    max_err = std::max(max_err, std::fabs(double(ga[i]) + gb[i] - g4[i]));
  }
  EXPECT_LT(max_err, 1e-4 * max_g);
  // Back to the larger batch: the same result as the first time.
  EXPECT_EQ(Step(*model, x4, l4).loss_sum, loss4);
  EXPECT_EQ(HostValues(model->flat_gradients()), g4);
  // Evaluation of a model without batch norm equals the training forward,
  // and leaves the gradients alone.
  const Metrics eval = Eval(*model, x4, l4);
  EXPECT_EQ(eval.loss_sum, loss4);
  EXPECT_EQ(HostValues(model->flat_gradients()), g4);
}

// With batch norm, a step's result depends only on its own batch, whatever
// batch sizes came before it.
TEST_F(ModelTest, ResNetBatchSizeChangesAndBatchNormState) {
  const ModelConfig config = Config("resnet18", {3, 12, 12}, 10);
  auto model = MakeModel(config, cpu(), 2);
  auto fresh = MakeModel(config, cpu(), 2);
  ASSERT_TRUE(model && fresh);
  const std::vector<float> x = Uniform(5 * 3 * 144, 8);
  const std::vector<int32_t> labels = {0, 1, 2, 3, 4};
  Tensor x5 = DeviceTensor(cpu(), {5, 3, 12, 12}, x);
  Tensor l5 = DeviceLabels(cpu(), labels);
  Tensor x2 = DeviceTensor(cpu(), {2, 3, 12, 12}, absl::MakeConstSpan(x.data(), 2 * 432));
  Tensor l2 = DeviceLabels(cpu(), absl::MakeConstSpan(labels.data(), 2));

  Step(*model, x5, l5);
  const float loss2 = Step(*model, x2, l2).loss_sum;
  const float fresh2 = Step(*fresh, x2, l2).loss_sum;
  EXPECT_EQ(loss2, fresh2);
  EXPECT_EQ(HostValues(model->flat_gradients()), HostValues(fresh->flat_gradients()));

  // Two training steps counted; evaluation uses but does not change the
  // running statistics, nor the gradients.
  auto count = model->Find("b1.bn.num_batches_tracked");
  ASSERT_TRUE(count.ok());
  EXPECT_EQ(HostValues(*count), std::vector<float>{2.0f});
  const std::vector<float> buffers = HostValues(model->flat_buffers());
  const std::vector<float> grads = HostValues(model->flat_gradients());
  const Metrics e5 = Eval(*model, x5, l5);
  const Metrics e2 = Eval(*model, x2, l2);
  EXPECT_TRUE(std::isfinite(e5.loss_sum));
  EXPECT_EQ(HostValues(model->flat_buffers()), buffers);
  EXPECT_EQ(HostValues(model->flat_gradients()), grads);
  // Inference is per sample: the first two samples' loss is the same alone.
  Tensor x3 = DeviceTensor(cpu(), {3, 3, 12, 12}, absl::MakeConstSpan(x.data() + 2 * 432, 3 * 432));
  Tensor l3 = DeviceLabels(cpu(), absl::MakeConstSpan(labels.data() + 2, 3));
  const Metrics e3 = Eval(*model, x3, l3);
  EXPECT_NEAR(e2.loss_sum + e3.loss_sum, e5.loss_sum, 1e-4 * std::fabs(e5.loss_sum));
  EXPECT_EQ(e2.correct + e3.correct, e5.correct);
}

// --- GPU against CPU ---

TEST_F(ModelTest, GpuMatchesCpu) {
  if (ps::CudaGpuCount() == 0) {
    GTEST_SKIP() << "no usable CUDA GPU: the GPU-vs-CPU model check needs one";
  }
  DeviceSpec spec;
  spec.type = DeviceType::kCuda;
  spec.gpu_ids = {0};
  auto gpus = CreateDevices(spec);
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  Device* gpu = (*gpus)[0].get();

  const ModelConfig configs[] = {
      Config("softmax", {1, 28, 28}, 10),  Config("mlp", {1, 28, 28}, 10, {64, 32}),
      Config("lenet", {1, 28, 28}, 10),    Config("lenet_relu", {1, 28, 28}, 10),
      Config("resnet18", {3, 32, 32}, 10), Config("resnet18_cifar", {3, 16, 16}, 10),
  };
  for (const ModelConfig& config : configs) {
    SCOPED_TRACE(config.name);
    auto on_cpu = MakeModel(config, cpu(), 21);
    auto on_gpu = MakeModel(config, gpu, 21);
    ASSERT_TRUE(on_cpu && on_gpu);
    // Bit-identical initial weights.
    EXPECT_EQ(HostValues(on_cpu->flat_parameters()), HostValues(on_gpu->flat_parameters()));
    EXPECT_EQ(HostValues(on_cpu->flat_buffers()), HostValues(on_gpu->flat_buffers()));
    // The batch grows, then shrinks. ResNet's stage-4 planes are 1x1 here, so
    // its batch norm averages over n values: n >= 8 keeps it well conditioned.
    for (int64_t n : {12, 16, 8}) {
      const int64_t count = n * NumElements(config.input_shape);
      const std::vector<float> x = Uniform(count, 100 + n);
      std::vector<int32_t> labels(n);
      for (int64_t i = 0; i < n; ++i) labels[i] = static_cast<int32_t>(i % 10);
      const Metrics c =
          Step(*on_cpu, DeviceTensor(cpu(), BatchShape(config, n), x), DeviceLabels(cpu(), labels));
      const Metrics g =
          Step(*on_gpu, DeviceTensor(gpu, BatchShape(config, n), x), DeviceLabels(gpu, labels));
      EXPECT_NEAR(g.loss_sum, c.loss_sum, 1e-4 * std::fabs(c.loss_sum) + 1e-5) << "n=" << n;
      EXPECT_EQ(g.correct, c.correct) << "n=" << n;
      const std::vector<float> gc = HostValues(on_cpu->flat_gradients());
      const std::vector<float> gg = HostValues(on_gpu->flat_gradients());
      double max_g = 0;
      for (float v : gc) max_g = std::max(max_g, std::fabs(double(v)));
      std::vector<double> a(gg.begin(), gg.end()), b(gc.begin(), gc.end());
      EXPECT_TRUE(GradientsClose("gpu vs cpu gradients", a, b, 1e-2, 1e-4 * max_g)) << "n=" << n;
      const std::vector<float> bc = HostValues(on_cpu->flat_buffers());
      const std::vector<float> bg = HostValues(on_gpu->flat_buffers());
      std::vector<double> ba(bg.begin(), bg.end()), bb(bc.begin(), bc.end());
      EXPECT_TRUE(GradientsClose("gpu vs cpu buffers", ba, bb, 1e-3, 1e-5)) << "n=" << n;
      const Metrics ec =
          Eval(*on_cpu, DeviceTensor(cpu(), BatchShape(config, n), x), DeviceLabels(cpu(), labels));
      const Metrics eg =
          Eval(*on_gpu, DeviceTensor(gpu, BatchShape(config, n), x), DeviceLabels(gpu, labels));
      EXPECT_NEAR(eg.loss_sum, ec.loss_sum, 1e-4 * std::fabs(ec.loss_sum) + 1e-5) << "n=" << n;
    }
  }
}

}  // namespace
}  // namespace ps::worker::model
