// PyTorch 1.13 as the oracle for the C++ trainer, end to end:
//
//  (a) Weights saved after training, loaded into the equivalent torch.nn
//      model (worker/model/torch_models.py), give the test accuracy the C++
//      Trainer::Evaluate measured, to 0.001, and the same mean loss.
//  (b) Steps of the trainer (LocalParameterStore: SGD with momentum and
//      weight decay, the gradient of the mean loss) from the same weights on
//      the same batches give torch.optim.SGD's parameters and batch-norm
//      buffers, to float tolerance. PyTorch also takes the steps in float64,
//      which tells our rounding from PyTorch's and serves as the oracle where
//      PyTorch's own float32 result strays from it.
//
// PyTorch's side is pytorch_parity.py, run with the system's python3; it only
// computes, the comparisons are here. The tests skip when no python3 with
// torch is installed. They use Fashion-MNIST from kFashionMnistDir when that
// directory exists, else the "synthetic" dataset.

#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/cpu_device.h"
#include "common/optimizer/optimizer.h"
#include "common/safetensors.h"
#include "common/testing/subprocess.h"
#include "gtest/gtest.h"
#include "worker/data/dataset.h"
#include "worker/data/loader.h"
#include "worker/local_parameter_store.h"
#include "worker/model/model.h"
#include "worker/trainer.h"
#include "worker/weights.h"

namespace ps::worker {
namespace {

constexpr char kFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

std::string ScriptPath() { return testing::RunfilePath("tests/pytorch_parity.py"); }

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Samples [begin, begin + n) of `dataset` as a dataset of their own.
data::Dataset Slice(const data::Dataset& dataset, int64_t begin, int64_t n) {
  data::Dataset out;
  out.name = absl::StrCat(dataset.name, "[", begin, ":", begin + n, "]");
  out.sample_shape = dataset.sample_shape;
  out.num_classes = dataset.num_classes;
  const int64_t e = dataset.sample_elements();
  out.pixels.assign(dataset.pixels.begin() + begin * e, dataset.pixels.begin() + (begin + n) * e);
  out.labels.assign(dataset.labels.begin() + begin, dataset.labels.begin() + begin + n);
  return out;
}

// The samples as pytorch_parity.py reads them: raw "pixels" U8 [N, C, H, W]
// (it normalises them itself) and "labels" I64 [N].
absl::Status WriteSamples(const data::Dataset& dataset, const std::string& path) {
  Shape shape = {dataset.size()};
  shape.insert(shape.end(), dataset.sample_shape.begin(), dataset.sample_shape.end());
  std::vector<NamedHostTensor> tensors;
  tensors.push_back({"pixels", SafetensorsDType::kU8, shape, dataset.pixels});
  std::vector<int64_t> labels(dataset.labels.begin(), dataset.labels.end());
  absl::StatusOr<NamedHostTensor> t = NamedHostTensor::FromInt64s("labels", {dataset.size()}, labels);
  if (!t.ok()) return t.status();
  tensors.push_back(*std::move(t));
  return WriteSafetensors(path, tensors);
}

// "key value" lines.
std::map<std::string, double> ReadKeyValues(const std::string& path) {
  std::map<std::string, double> out;
  std::ifstream in(path);
  std::string key;
  double value;
  while (in >> key >> value) out[key] = value;
  return out;
}

model::ModelConfig Config(const data::Dataset& data, const std::string& name) {
  model::ModelConfig config;
  config.name = name;
  config.input_shape = data.sample_shape;
  config.num_classes = data.num_classes;
  return config;
}

// The model name as pytorch_parity.py takes it ("mlp:256").
std::string TorchSpec(const model::ModelConfig& config) {
  if (config.name != "mlp") return config.name;
  return absl::StrCat("mlp:", absl::StrJoin(config.mlp_hidden, ","));
}

// One CPU device, an in-process SGD store and a trainer over them.
struct Rig {
  std::unique_ptr<CpuDevice> device;
  std::unique_ptr<LocalParameterStore> store;
  std::unique_ptr<Trainer> trainer;
};

absl::StatusOr<Rig> MakeRig(const model::ModelConfig& config, const OptimizerOptions& sgd,
                            const TrainerOptions& options, const data::Dataset& train) {
  Rig rig;
  rig.device = std::make_unique<CpuDevice>(0, 2);
  absl::StatusOr<std::unique_ptr<LocalParameterStore>> store = LocalParameterStore::Create(sgd);
  if (!store.ok()) return store.status();
  rig.store = *std::move(store);
  absl::StatusOr<std::unique_ptr<Trainer>> trainer =
      Trainer::Create(options, config, {rig.device.get()}, rig.store.get(), &train, nullptr);
  if (!trainer.ok()) return trainer.status();
  rig.trainer = *std::move(trainer);
  return rig;
}

class PytorchParityTest : public ::testing::Test {
 protected:
  // Debian's interpreter first: python3-torch lives there, while a python3
  // earlier on PATH (pyenv, a virtualenv) may lack torch.
  static void SetUpTestSuite() {
    const std::string python = testing::FindPython("torch, numpy");
    if (python.empty()) return;
    python_ = new std::string(python);
    // Real data when it is installed: a missing directory means synthetic
    // data, but a directory that does not load is an error, not a fallback.
    const bool real = IsDirectory(kFashionMnistDir);
    const std::string name = real ? "fashion_mnist" : "synthetic";
    absl::StatusOr<data::Dataset> train = data::LoadDataset(name, kFashionMnistDir, "train");
    absl::StatusOr<data::Dataset> test = data::LoadDataset(name, kFashionMnistDir, "test");
    if (!train.ok() || !test.ok()) {
      data_error_ = new std::string(absl::StrCat(
          name, " from ", kFashionMnistDir, ": ", (train.ok() ? test : train).status().ToString()));
      return;
    }
    synthetic_ = !real;
    train_ = new data::Dataset(*std::move(train));
    test_ = new data::Dataset(*std::move(test));
    std::cout << "data: " << name << " (" << train_->size() << " train, " << test_->size()
              << " test samples)\n";
  }

  void SetUp() override {
    if (python_ == nullptr) {
      GTEST_SKIP() << "no python3 with torch and numpy (tried /usr/bin/python3 and python3 on "
                      "PATH); install Debian's python3-torch to run the PyTorch parity checks";
    }
    ASSERT_EQ(data_error_, nullptr) << *data_error_;
  }

  // Runs pytorch_parity.py with `args`; fails the test on a non-zero exit.
  void RunScript(const std::string& args) {
    std::string output;
    const int code =
        testing::RunCommand(absl::StrCat(*python_, " ", testing::ShellQuote(ScriptPath()), " ", args), &output);
    ASSERT_EQ(code, 0) << "pytorch_parity.py " << args << ":\n" << output;
    std::cout << output;
  }

  static std::string* python_;
  static std::string* data_error_;
  static data::Dataset* train_;
  static data::Dataset* test_;
  static bool synthetic_;
};

std::string* PytorchParityTest::python_ = nullptr;
std::string* PytorchParityTest::data_error_ = nullptr;
data::Dataset* PytorchParityTest::train_ = nullptr;
data::Dataset* PytorchParityTest::test_ = nullptr;
bool PytorchParityTest::synthetic_ = false;

// (a): train, save, evaluate here and in PyTorch on the same test samples.
struct AccuracyCase {
  std::string model;
  int64_t batch_size;
  int64_t steps;
  float lr;
  float momentum;
  int64_t eval_samples;  // the first ones of the test split
  // The C++ model must have learned at least this much (on Fashion-MNIST /
  // on synthetic data), or parity would be shown on near-uniform guesses.
  double min_accuracy;
  double min_accuracy_synthetic;
};

class AccuracyParityTest : public PytorchParityTest,
                           public ::testing::WithParamInterface<AccuracyCase> {};

TEST_P(AccuracyParityTest, SavedWeightsGiveTheSameTestAccuracyInPytorch) {
  const AccuracyCase& c = GetParam();
  const model::ModelConfig config = Config(*train_, c.model);
  OptimizerOptions sgd;
  sgd.sgd.lr = c.lr;
  sgd.sgd.momentum = c.momentum;
  sgd.sgd.weight_decay = 5e-4f;
  TrainerOptions options;
  options.batch_size = c.batch_size;
  options.epochs = 1 + c.steps * c.batch_size / train_->size();  // max_steps stops it
  options.max_steps = c.steps;
  options.seed = 1;
  options.evaluate = false;
  absl::StatusOr<Rig> rig = MakeRig(config, sgd, options, *train_);
  ASSERT_TRUE(rig.ok()) << rig.status();
  absl::StatusOr<TrainingReport> report = rig->trainer->Run();
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->steps, c.steps);

  const std::string weights = testing::TestTmpPath(c.model + "_trained.safetensors");
  ASSERT_TRUE(SaveWeights(rig->trainer->model(), weights).ok());
  const data::Dataset eval = Slice(*test_, 0, std::min(c.eval_samples, test_->size()));
  double loss = 0, accuracy = 0;
  ASSERT_TRUE(rig->trainer->Evaluate(eval, &loss, &accuracy).ok());
  // Parity of an untrained model's near-uniform guesses would prove little.
  EXPECT_GE(accuracy, synthetic_ ? c.min_accuracy_synthetic : c.min_accuracy)
      << c.model << " did not learn in " << c.steps << " steps";

  const std::string samples = testing::TestTmpPath(c.model + "_eval_samples.safetensors");
  ASSERT_TRUE(WriteSamples(eval, samples).ok());
  const std::string result = testing::TestTmpPath(c.model + "_torch_eval.txt");
  RunScript(absl::StrCat("evaluate ", TorchSpec(config), " ", testing::ShellQuote(weights), " ",
                         testing::ShellQuote(samples), " ", testing::ShellQuote(result)));
  if (HasFatalFailure()) return;
  std::map<std::string, double> torch = ReadKeyValues(result);
  ASSERT_EQ(torch.count("accuracy"), 1u) << result;
  ASSERT_EQ(torch.count("loss"), 1u) << result;
  ASSERT_EQ(torch["samples"], eval.size());

  // Accuracy to 0.001: at most 0.001 * n predictions may differ in count.
  const int64_t correct = std::llround(accuracy * eval.size());
  const int64_t torch_correct = std::llround(torch["correct"]);
  const int64_t allowed = static_cast<int64_t>(0.001 * eval.size() + 1e-9);
  std::cout << absl::StreamFormat(
      "%s after %d steps, %d test samples: accuracy C++ %.4f torch %.4f (correct %d vs %d, "
      "%d allowed to differ); mean loss C++ %.6f torch %.6f (diff %.2e); smallest top-2 logit "
      "margin in torch %.2e\n",
      c.model, c.steps, eval.size(), accuracy, torch["accuracy"], correct, torch_correct, allowed,
      loss, torch["loss"], std::fabs(loss - torch["loss"]), torch["min_margin"]);
  EXPECT_LE(std::llabs(correct - torch_correct), allowed) << c.model;
  // Both are float sums of per-sample cross-entropies in different orders.
  EXPECT_LE(std::fabs(loss - torch["loss"]), 1e-5 + 1e-4 * std::fabs(torch["loss"])) << c.model;
}

INSTANTIATE_TEST_SUITE_P(
    Models, AccuracyParityTest,
    // Sigmoid LeNet sits on its plateau for the first few hundred steps; on
    // synthetic data it has not left it after 300 (every prediction is one
    // class), so there its guard is off and the parity weaker.
    ::testing::Values(AccuracyCase{"lenet", 128, 300, 0.1f, 0.9f, 10000, 0.25, 0.0},
                      AccuracyCase{"mlp", 128, 100, 0.05f, 0.9f, 10000, 0.7, 0.9},
                      // Without momentum: at 0.9 a fresh batch-norm ResNet
                      // diverges in both frameworks. 32 steps, not 16: after
                      // 16, rounding alone moves the accuracy between 0.20
                      // and 0.45 (PyTorch under 1e-7 relative perturbations
                      // of the stem's output: 0.28-0.45; ours 0.20, 0.39 or
                      // 0.42 with different GEMM kernels); after 32,
                      // PyTorch's spread is 0.53-0.60.
                      AccuracyCase{"resnet18", 32, 32, 0.05f, 0.f, 1000, 0.3, 0.8}),
    // No resnet18_cifar case: it costs 14 times resnet18's compute a sample,
    // and after 16 or 32 steps of batch 16 its test accuracy in eval mode is
    // still 0.09-0.19 (in PyTorch too: the running statistics have not
    // settled), so its guard would prove nothing. Its saved weights load
    // into torch in SgdParityTest, and its eval-mode forward is compared with
    // torch's in model_test's OneStepMatchesTorch.
    [](const ::testing::TestParamInfo<AccuracyCase>& info) { return info.param.model; });

// (b): the same steps from the same weights, here and with torch.optim.SGD.
struct SgdCase {
  std::string model;
  int64_t batch_size;
  int64_t steps;
  float lr = 0.1f;
};

class SgdParityTest : public PytorchParityTest, public ::testing::WithParamInterface<SgdCase> {};

constexpr double kAtol = 1e-5, kRtol = 1e-4;
constexpr double kStepRtol = 1e-4;  // see RelativeStepError

// How far the float tensors of `a` lie from those of `reference`, in units
// of the tolerance kAtol + kRtol * |reference|: worst > 1 is a failure.
struct Distance {
  double worst = 0;      // the largest |a - reference| / tolerance
  double max_abs = 0;    // the largest |a - reference|
  std::string where = "-";  // the worst element, with its values
  int64_t floats = 0;
};

// Compares two state dicts tensor by tensor (adding a failure for different
// names, dtypes or shapes, or different integer tensors).
Distance Compare(const SafetensorsFile& a, const SafetensorsFile& reference,
                 const std::string& a_name, const std::string& reference_name) {
  Distance d;
  std::vector<std::string> names, reference_names;
  for (const NamedHostTensor& t : a.tensors) names.push_back(t.name);
  for (const NamedHostTensor& t : reference.tensors) reference_names.push_back(t.name);
  // The header order is the writer's choice (WriteSafetensors' differs from
  // the reference implementation's); the set of names is the contract.
  std::sort(names.begin(), names.end());
  std::sort(reference_names.begin(), reference_names.end());
  EXPECT_EQ(names, reference_names) << a_name << " vs " << reference_name;
  for (const NamedHostTensor& x : a.tensors) {
    absl::StatusOr<const NamedHostTensor*> y = reference.Find(x.name);
    if (!y.ok()) continue;  // reported above
    SCOPED_TRACE(x.name);
    EXPECT_EQ(SafetensorsDTypeName(x.dtype), SafetensorsDTypeName((*y)->dtype));
    EXPECT_EQ(x.shape, (*y)->shape);
    if (x.dtype != (*y)->dtype || x.shape != (*y)->shape) continue;  // reported above
    if (x.dtype != SafetensorsDType::kF32) {
      absl::StatusOr<std::vector<int64_t>> u = x.ToInt64s(), v = (*y)->ToInt64s();
      EXPECT_TRUE(u.ok() && v.ok()) << SafetensorsDTypeName(x.dtype) << " is not an integer type";
      if (u.ok() && v.ok()) {
        EXPECT_EQ(*u, *v) << a_name << " vs " << reference_name;
      }
      continue;
    }
    const std::vector<float> u = *x.ToFloats();
    const std::vector<float> v = *(*y)->ToFloats();
    for (size_t i = 0; i < u.size(); ++i) {
      const double diff = std::fabs(double(u[i]) - v[i]);
      const double ratio = diff / (kAtol + kRtol * std::fabs(double(v[i])));
      d.max_abs = std::max(d.max_abs, diff);
      if (ratio > d.worst) {
        d.worst = ratio;
        d.where = absl::StrFormat("%s[%d]: %s %.9g, %s %.9g", x.name, i, a_name, u[i],
                                  reference_name, v[i]);
      }
    }
    d.floats += static_cast<int64_t>(u.size());
  }
  return d;
}

// The largest |after - before| over the float tensors both files hold.
double LargestChange(const SafetensorsFile& after, const SafetensorsFile& before) {
  double largest = 0;
  for (const NamedHostTensor& x : after.tensors) {
    absl::StatusOr<const NamedHostTensor*> y = before.Find(x.name);
    if (!y.ok() || x.dtype != SafetensorsDType::kF32 || (*y)->dtype != x.dtype ||
        (*y)->shape != x.shape) {
      continue;
    }
    const std::vector<float> u = *x.ToFloats();
    const std::vector<float> v = *(*y)->ToFloats();
    for (size_t i = 0; i < u.size(); ++i) {
      largest = std::max(largest, std::fabs(double(u[i]) - v[i]));
    }
  }
  return largest;
}

// ||(a - before) - (reference - before)|| / ||reference - before|| over all
// float elements: the error of the step as a whole. Elementwise tolerances on
// the weights let through a bug as large as a forgotten weight decay (lr *
// 5e-4 * |w| a step, below 1e-4 * |w|); the norm of the step does not.
double RelativeStepError(const SafetensorsFile& a, const SafetensorsFile& reference,
                         const SafetensorsFile& before) {
  double error = 0, step = 0;
  for (const NamedHostTensor& x : a.tensors) {
    absl::StatusOr<const NamedHostTensor*> y = reference.Find(x.name);
    absl::StatusOr<const NamedHostTensor*> z = before.Find(x.name);
    if (!y.ok() || !z.ok() || x.dtype != SafetensorsDType::kF32 || (*y)->dtype != x.dtype ||
        (*y)->shape != x.shape || (*z)->shape != x.shape) {
      continue;  // Compare() reports these
    }
    const std::vector<float> u = *x.ToFloats();
    const std::vector<float> v = *(*y)->ToFloats();
    const std::vector<float> w = *(*z)->ToFloats();
    for (size_t i = 0; i < u.size(); ++i) {
      error += (double(u[i]) - v[i]) * (double(u[i]) - v[i]);
      step += (double(v[i]) - w[i]) * (double(v[i]) - w[i]);
    }
  }
  return std::sqrt(error) / std::max(1e-30, std::sqrt(step));
}

TEST_P(SgdParityTest, StepsGiveTorchOptimSgdsParameters) {
  const SgdCase& c = GetParam();
  const model::ModelConfig config = Config(*train_, c.model);
  const std::string tag = absl::StrCat(c.model, "_", c.steps);

  // 1. W0: a seeded initialisation, saved.
  CpuDevice device(0, 2);
  absl::StatusOr<std::unique_ptr<model::Model>> initial = model::Model::Create(config, &device);
  ASSERT_TRUE(initial.ok()) << initial.status();
  ASSERT_TRUE((*initial)->Initialize(42).ok());
  const std::string w0 = testing::TestTmpPath(tag + "_w0.safetensors");
  ASSERT_TRUE(SaveWeights(**initial, w0).ok());

  // 2. The trainer starts from W0 and takes steps 0.. of epoch 0 in data
  // order: batch s is training samples [s * B, (s + 1) * B).
  OptimizerOptions sgd;
  sgd.sgd.lr = c.lr;
  sgd.sgd.momentum = 0.9f;
  sgd.sgd.weight_decay = 5e-4f;
  TrainerOptions options;
  options.batch_size = c.batch_size;
  options.epochs = 1;
  options.shuffle = false;
  options.evaluate = false;
  options.seed = 7;  // unused by the initialisation: init_weights replaces it
  options.init_weights = w0;
  absl::StatusOr<Rig> rig = MakeRig(config, sgd, options, *train_);
  ASSERT_TRUE(rig.ok()) << rig.status();
  for (int64_t s = 0; s < c.steps; ++s) {
    const absl::Status step = rig->trainer->TrainStep(0, s);
    ASSERT_TRUE(step.ok()) << step;
  }
  ASSERT_TRUE(rig->trainer->FinishCommunication().ok());
  const std::string w1 = testing::TestTmpPath(tag + "_w1.safetensors");
  ASSERT_TRUE(SaveWeights(rig->trainer->model(), w1).ok());

  // 3. PyTorch takes the same steps from W0 on the same samples, in float32
  // (the oracle) and in float64 (nearly exact, for the diagnosis).
  const std::string samples = testing::TestTmpPath(tag + "_batches.safetensors");
  ASSERT_TRUE(WriteSamples(Slice(*train_, 0, c.steps * c.batch_size), samples).ok());
  std::map<std::string, SafetensorsFile> torch;
  for (const char* dtype : {"float32", "float64", "float32_im2col"}) {
    const std::string out = testing::TestTmpPath(absl::StrCat(tag, "_w1_torch_", dtype, ".safetensors"));
    RunScript(absl::StrFormat("sgd %s %s %s %.9g %.9g %.9g %d %s %s", TorchSpec(config),
                              testing::ShellQuote(w0), testing::ShellQuote(samples), sgd.sgd.lr,
                              sgd.sgd.momentum, sgd.sgd.weight_decay, c.batch_size,
                              testing::ShellQuote(out), dtype));
    if (HasFatalFailure()) return;
    absl::StatusOr<SafetensorsFile> file = ReadSafetensors(out);
    ASSERT_TRUE(file.ok()) << file.status();
    torch[dtype] = *std::move(file);
  }
  absl::StatusOr<SafetensorsFile> before = ReadSafetensors(w0);
  absl::StatusOr<SafetensorsFile> ours = ReadSafetensors(w1);
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_TRUE(ours.ok()) << ours.status();

  // 4. Every tensor: same names, dtypes and shapes, counters equal (and equal
  // to the steps taken), floats within kAtol + kRtol * |torch|.
  const Distance parity = Compare(*ours, torch["float32"], "C++", "torch");
  const Distance ours_to_exact = Compare(*ours, torch["float64"], "C++", "torch f64");
  // PyTorch's float32 spread: the farther of its two float32 answers (its
  // oneDNN convolutions, and im2col with BLAS) from its float64 one.
  Distance torch_to_exact = Compare(torch["float32"], torch["float64"], "torch", "torch f64");
  const Distance im2col_to_exact =
      Compare(torch["float32_im2col"], torch["float64"], "torch im2col", "torch f64");
  if (im2col_to_exact.worst > torch_to_exact.worst) torch_to_exact = im2col_to_exact;
  const double update = LargestChange(torch["float32"], *before);
  const double step_error = RelativeStepError(*ours, torch["float32"], *before);
  const double step_error_exact = RelativeStepError(*ours, torch["float64"], *before);
  const double torch_step_error_exact =
      std::max(RelativeStepError(torch["float32"], torch["float64"], *before),
               RelativeStepError(torch["float32_im2col"], torch["float64"], *before));
  for (const NamedHostTensor& t : ours->tensors) {
    if (t.dtype == SafetensorsDType::kI64) {
      EXPECT_EQ(*t.ToInt64s(), std::vector<int64_t>{c.steps}) << t.name;
    }
  }
  std::cout << absl::StreamFormat(
      "%s, %d step(s) of batch %d at lr %g: %d floats in %d tensors; max |C++ - torch| %.3e, "
      "worst |diff| / (%.0e + %.0e |torch|) = %.3f at %s; against float64 torch: C++ %.3f, "
      "torch float32 (the farther of two) %.3f; largest update |W1 - W0| %.3e; relative error "
      "of the whole step against torch %.2e, against float64 torch: C++ %.2e, torch float32 "
      "(the farther of two) %.2e\n",
      c.model, c.steps, c.batch_size, c.lr, parity.floats, ours->tensors.size(), parity.max_abs,
      kAtol, kRtol, parity.worst, parity.where, ours_to_exact.worst, torch_to_exact.worst,
      update, step_error, step_error_exact, torch_step_error_exact);
  // PyTorch in float32 is the oracle where both its float32 answers agree
  // with its float64 one to the tolerance. Where they do not, a float32
  // comparison would measure rounding, so there only the float64 result
  // counts, and we must be at least as close to it as PyTorch's float32 is.
  // (So far: ResNet-18 on synthetic data, where PyTorch's float32 gradient of
  // the stem conv is 6.5e-3 off its float64 one, 55 tolerances after one
  // step; and three ResNet-18 steps on Fashion-MNIST, where PyTorch's oneDNN
  // float32 run is 0.22 tolerances from float64 but its im2col one 1068: a
  // ReLU input within rounding of zero decides a different way, and one such
  // decision moves a layer's gradient by about 1 / sqrt(its size), 4e-3 at
  // 65,536 values. A 1e-6 relative perturbation of the stem conv's output
  // changes PyTorch's float32 gradients by 7.7e-3 after one step.)
  const std::string diagnosis = absl::StrCat(
      "Against PyTorch in float64, C++ is ", ours_to_exact.worst, " tolerances off (",
      ours_to_exact.where, ") and PyTorch's float32 ", torch_to_exact.worst, " (",
      torch_to_exact.where, "): C++ far off while float32 torch is close points at a C++ bug; "
      "both far off, at ill-conditioning.");
  if (torch_to_exact.worst <= 1.0) {
    EXPECT_LE(parity.worst, 1.0) << parity.where << ". " << diagnosis;
  } else {
    std::cout << "PyTorch's float32 result is " << torch_to_exact.worst
              << " tolerances from its float64 one: held to the float64 result only\n";
  }
  if (torch_step_error_exact <= kStepRtol) {
    EXPECT_LE(step_error, kStepRtol);
  }
  EXPECT_LE(ours_to_exact.worst, std::max(1.0, torch_to_exact.worst)) << diagnosis;
  EXPECT_LE(step_error_exact, std::max(kStepRtol, torch_step_error_exact));
  // The steps moved the weights well beyond the tolerance, so agreement is
  // not just two copies of W0.
  EXPECT_GT(update, 100 * kAtol);
}

INSTANTIATE_TEST_SUITE_P(
    Models, SgdParityTest,
    ::testing::Values(SgdCase{"mlp", 64, 1}, SgdCase{"lenet", 64, 1},
                      SgdCase{"resnet18", 32, 1},
                      // Three steps exercise the momentum buffer (one step
                      // only initialises it to the first gradient).
                      SgdCase{"mlp", 64, 3}, SgdCase{"lenet", 64, 3},
                      // At lr 0.1 this fresh batch-norm ResNet diverges in
                      // both frameworks (batch 16: loss 3.8, 18.6, 34).
                      SgdCase{"resnet18", 32, 3, 0.01f},
                      // Batch 3 because its 28x28 stage 1 has 16 times the
                      // ReLUs, and at most batches one of them has an input
                      // within float32 rounding of zero (float64 forward at
                      // W0: batch 8, one at 9e-8 of its layer's rms; 10 and
                      // 12, 5e-8 and 1e-8), which float32 then decides one
                      // way or the other: at batch 8 our oneDNN forward
                      // (AVX-512) decides against float64 and PyTorch's two
                      // float32 runs for it, 60 tolerances off on the stem's
                      // weights; at 16 PyTorch's oneDNN run is the one 38
                      // off. At batch 3 the closest ReLU input keeps 2.1e-6
                      // of its rms: well-conditioned, so held to float32.
                      // Three steps test nothing this model adds (the
                      // momentum buffer is the optimizer's).
                      SgdCase{"resnet18_cifar", 3, 1}),
    [](const ::testing::TestParamInfo<SgdCase>& info) {
      return absl::StrCat(info.param.model, "_", info.param.steps, "_steps");
    });

}  // namespace
}  // namespace ps::worker
