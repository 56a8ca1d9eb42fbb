#include "worker/model/layer.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/cpu_device.h"
#include "gtest/gtest.h"
#include "worker/model/activation_layer.h"
#include "worker/model/batch_norm_layer.h"
#include "worker/model/conv_layer.h"
#include "worker/model/flatten_layer.h"
#include "worker/model/linear_layer.h"
#include "worker/model/parameter_set.h"
#include "worker/model/pool_layer.h"
#include "worker/model/residual_layer.h"
#include "worker/model/sequential.h"
#include "worker/model/test_util.h"

namespace ps::worker::model {
namespace {

using ::ps::worker::model::testing::DeviceTensor;
using ::ps::worker::model::testing::GradientsClose;
using ::ps::worker::model::testing::HostValues;
using ::ps::worker::model::testing::Uniform;

// How the input of a gradient check is drawn and how closely the gradients
// must agree. Central differences in fp32 with the loss summed in double.
struct CheckOptions {
  double eps = 1e-2;
  double rtol = 1e-2;
  double atol = 1e-3;
  // Inputs in +-[0.1, 1]: no ReLU kink within eps of any input.
  bool away_from_zero = false;
  // Inputs a shuffled grid with spacing > 2 eps: no max-pooling ties.
  bool distinct = false;
  // At most this many elements of x and of the parameters are perturbed
  // (evenly spaced); all of them when there are fewer.
  int64_t max_checked = 400;

  CheckOptions& Eps(double v) {
    eps = v;
    return *this;
  }
  CheckOptions& Atol(double v) {
    atol = v;
    return *this;
  }
  CheckOptions& AwayFromZero() {
    away_from_zero = true;
    return *this;
  }
  CheckOptions& Distinct() {
    distinct = true;
    return *this;
  }
};

std::vector<float> MakeInput(int64_t n, uint64_t seed, const CheckOptions& opt) {
  std::vector<float> x = Uniform(n, seed);
  if (opt.distinct) {
    std::vector<int64_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937_64(seed));
    for (int64_t i = 0; i < n; ++i) x[i] = 2.0f * (order[i] + 0.5f) / n - 1.0f;
  } else if (opt.away_from_zero) {
    for (float& v : x) v = (v < 0 ? -1.0f : 1.0f) * (0.1f + 0.9f * std::fabs(v));
  }
  return x;
}

std::vector<int64_t> CheckedIndices(int64_t n, int64_t max_checked) {
  std::vector<int64_t> idx;
  const int64_t step = std::max<int64_t>(1, (n + max_checked - 1) / max_checked);
  for (int64_t i = 0; i < n; i += step) idx.push_back(i);
  return idx;
}

// Compares the layer's backward pass with central differences of the loss
// L = sum_i r_i * y_i (r random) with respect to every (or a spread sample
// of) input element and parameter. Parameters are drawn uniformly from
// [-1, 1], so biases and batch-norm betas are not zero.
void CheckLayerGradients(Device* device, Layer& layer, const Shape& x_shape,
                         const CheckOptions& opt, uint64_t seed = 1) {
  absl::StatusOr<std::unique_ptr<ParameterSet>> params = ParameterSet::Create(layer, device);
  ASSERT_TRUE(params.ok()) << params.status();
  ASSERT_TRUE((*params)->Initialize(seed).ok());
  Tensor& flat = (*params)->flat_parameters();
  std::vector<float> p = Uniform(flat.num_elements(), seed + 1);
  ASSERT_TRUE(flat.CopyFromHost(p).ok());

  std::vector<float> x = MakeInput(NumElements(x_shape), seed + 2, opt);
  Tensor xt = DeviceTensor(device, x_shape, x);

  absl::StatusOr<Tensor> y = layer.Forward(xt, Mode::kTraining);
  ASSERT_TRUE(y.ok()) << y.status();
  absl::StatusOr<Shape> expected_shape = layer.OutputShape(x_shape);
  ASSERT_TRUE(expected_shape.ok());
  ASSERT_EQ(y->shape(), *expected_shape);
  const std::vector<float> r = Uniform(y->num_elements(), seed + 3);
  Tensor dy = DeviceTensor(device, y->shape(), r);
  absl::StatusOr<Tensor> dx = layer.Backward(dy, /*need_dx=*/true);
  ASSERT_TRUE(dx.ok()) << dx.status();
  ASSERT_EQ(dx->shape(), x_shape);
  const std::vector<float> dx_host = HostValues(*dx);
  const std::vector<float> grads = HostValues((*params)->flat_gradients());
  // dy must be left as it was (layers may share it, as Residual does).
  ASSERT_EQ(HostValues(dy), r);

  auto loss = [&]() -> double {
    absl::StatusOr<Tensor> out = layer.Forward(xt, Mode::kTraining);
    EXPECT_TRUE(out.ok()) << out.status();
    if (!out.ok()) return 0;
    const std::vector<float> v = HostValues(*out);
    double sum = 0;
    for (size_t i = 0; i < v.size(); ++i) sum += static_cast<double>(r[i]) * v[i];
    return sum;
  };

  {
    std::vector<double> analytic, numeric;
    for (int64_t i : CheckedIndices(x.size(), opt.max_checked)) {
      const float saved = x[i];
      x[i] = saved + static_cast<float>(opt.eps);
      ASSERT_TRUE(xt.CopyFromHost(x).ok());
      const double plus = loss();
      x[i] = saved - static_cast<float>(opt.eps);
      ASSERT_TRUE(xt.CopyFromHost(x).ok());
      const double minus = loss();
      x[i] = saved;
      numeric.push_back((plus - minus) / (2 * opt.eps));
      analytic.push_back(dx_host[i]);
    }
    ASSERT_TRUE(xt.CopyFromHost(x).ok());
    EXPECT_TRUE(GradientsClose(layer.Describe() + " dx", analytic, numeric, opt.rtol, opt.atol));
  }

  int64_t offset = 0;
  for (const ParamSpec& spec : (*params)->parameters()) {
    const int64_t n = NumElements(spec.shape);
    std::vector<double> analytic, numeric;
    for (int64_t i : CheckedIndices(n, opt.max_checked)) {
      const int64_t j = offset + i;
      const float saved = p[j];
      p[j] = saved + static_cast<float>(opt.eps);
      ASSERT_TRUE(flat.CopyFromHost(p).ok());
      const double plus = loss();
      p[j] = saved - static_cast<float>(opt.eps);
      ASSERT_TRUE(flat.CopyFromHost(p).ok());
      const double minus = loss();
      p[j] = saved;
      numeric.push_back((plus - minus) / (2 * opt.eps));
      analytic.push_back(grads[j]);
    }
    ASSERT_TRUE(flat.CopyFromHost(p).ok());
    EXPECT_TRUE(
        GradientsClose(layer.Describe() + " d" + spec.name, analytic, numeric, opt.rtol, opt.atol));
    offset += n;
  }
}

class LayerTest : public ::testing::Test {
 protected:
  CpuDevice device_{0, 2};
  Device* dev() { return &device_; }
};

// --- gradient checks, one per layer type ---

TEST_F(LayerTest, Conv2dStridedPaddedGradients) {
  Conv2d conv(dev(), 3, 4, 3, /*stride=*/2, /*pad=*/1);
  CheckLayerGradients(dev(), conv, {2, 3, 5, 5}, CheckOptions());
}

TEST_F(LayerTest, Conv2dLeNetLikeGradients) {
  Conv2d conv(dev(), 2, 3, 5, 1, 2);
  CheckLayerGradients(dev(), conv, {2, 2, 6, 6}, CheckOptions());
}

TEST_F(LayerTest, Conv2dOneByOneGradients) {
  Conv2d conv(dev(), 3, 2, 1, 2, 0);
  CheckLayerGradients(dev(), conv, {2, 3, 5, 5}, CheckOptions());
}

TEST_F(LayerTest, LinearGradients) {
  Linear linear(dev(), 5, 4);
  CheckLayerGradients(dev(), linear, {3, 5}, CheckOptions());
}

TEST_F(LayerTest, MaxPoolGradients) {
  Pool2d pool(dev(), Pool2d::Kind::kMax, 2, 2);
  CheckLayerGradients(dev(), pool, {2, 2, 4, 4}, CheckOptions().Eps(1e-3).Distinct());
}

TEST_F(LayerTest, MaxPoolPaddedOverlappingGradients) {
  Pool2d pool(dev(), Pool2d::Kind::kMax, 3, 2, 1);  // ResNet's stem pooling
  CheckLayerGradients(dev(), pool, {2, 2, 5, 5}, CheckOptions().Eps(1e-3).Distinct());
}

TEST_F(LayerTest, AvgPoolGradients) {
  Pool2d pool(dev(), Pool2d::Kind::kAverage, 2, 2);
  CheckLayerGradients(dev(), pool, {2, 2, 4, 5}, CheckOptions());
}

TEST_F(LayerTest, AvgPoolPaddedOverlappingGradients) {
  Pool2d pool(dev(), Pool2d::Kind::kAverage, 3, 2, 1);
  CheckLayerGradients(dev(), pool, {2, 2, 5, 5}, CheckOptions());
}

TEST_F(LayerTest, GlobalAvgPoolGradients) {
  GlobalAvgPool2d pool(dev());
  CheckLayerGradients(dev(), pool, {2, 3, 3, 4}, CheckOptions());
}

TEST_F(LayerTest, GlobalAvgPoolOfOnePixelGradients) {
  GlobalAvgPool2d pool(dev());
  CheckLayerGradients(dev(), pool, {2, 3, 1, 1}, CheckOptions());
}

TEST_F(LayerTest, ReluGradients) {
  Activation relu(dev(), Activation::Kind::kRelu);
  CheckLayerGradients(dev(), relu, {2, 3, 4}, CheckOptions().Eps(1e-3).AwayFromZero());
}

TEST_F(LayerTest, SigmoidGradients) {
  Activation sigmoid(dev(), Activation::Kind::kSigmoid);
  CheckLayerGradients(dev(), sigmoid, {2, 3, 4}, CheckOptions());
}

TEST_F(LayerTest, SigmoidAvgPoolGradients) {
  ActivationPool2d layer(dev(), Activation::Kind::kSigmoid, Pool2d::Kind::kAverage, 2, 2);
  CheckLayerGradients(dev(), layer, {2, 2, 4, 5}, CheckOptions());
}

TEST_F(LayerTest, ReluMaxPoolPaddedOverlappingGradients) {
  ActivationPool2d layer(dev(), Activation::Kind::kRelu, Pool2d::Kind::kMax, 3, 2, 1);
  CheckLayerGradients(dev(), layer, {2, 2, 5, 5}, CheckOptions().Eps(1e-3).Distinct());
}

// The fused layer gives exactly the unfused pair's output and input gradient.
TEST_F(LayerTest, ActivationPoolMatchesActivationThenPool) {
  const Shape shape = {3, 4, 9, 8};
  const std::vector<float> x = Uniform(NumElements(shape), 5, -5.f, 5.f);
  for (Activation::Kind act : {Activation::Kind::kRelu, Activation::Kind::kSigmoid}) {
    for (Pool2d::Kind pool : {Pool2d::Kind::kAverage, Pool2d::Kind::kMax}) {
      for (int64_t kernel : {2, 3}) {
        ActivationPool2d fused(dev(), act, pool, kernel, 2, kernel / 2);
        Sequential unfused(dev());
        unfused.Add("", std::make_unique<Activation>(dev(), act));
        unfused.Add("", std::make_unique<Pool2d>(dev(), pool, kernel, 2, kernel / 2));
        SCOPED_TRACE(fused.Describe());
        Tensor xt = DeviceTensor(dev(), shape, x);
        auto y_fused = fused.Forward(xt, Mode::kTraining);
        auto y_unfused = unfused.Forward(xt, Mode::kTraining);
        ASSERT_TRUE(y_fused.ok() && y_unfused.ok());
        ASSERT_EQ(y_fused->shape(), y_unfused->shape());
        EXPECT_EQ(HostValues(*y_fused), HostValues(*y_unfused));
        Tensor dy = DeviceTensor(dev(), y_fused->shape(), Uniform(y_fused->num_elements(), 6));
        auto dx_fused = fused.Backward(dy, true);
        auto dx_unfused = unfused.Backward(dy, true);
        ASSERT_TRUE(dx_fused.ok() && dx_unfused.ok());
        EXPECT_EQ(HostValues(*dx_fused), HostValues(*dx_unfused));
      }
    }
  }
}

TEST_F(LayerTest, Conv2dSigmoidAvgPoolGradients) {
  Conv2dActivationPool layer(dev(), 2, 3, 3, 1, 1, Activation::Kind::kSigmoid,
                             Pool2d::Kind::kAverage, 2, 2);
  CheckLayerGradients(dev(), layer, {2, 2, 6, 6}, CheckOptions());
}

// The fused layer gives exactly the output, input gradient and parameter
// gradients of Conv2d, Activation and Pool2d in sequence, and declares the
// same parameter names.
TEST_F(LayerTest, Conv2dActivationPoolMatchesSequence) {
  const Shape shape = {5, 2, 12, 12};
  const std::vector<float> x = Uniform(NumElements(shape), 8);
  for (Activation::Kind act : {Activation::Kind::kRelu, Activation::Kind::kSigmoid}) {
    for (Pool2d::Kind pool : {Pool2d::Kind::kAverage, Pool2d::Kind::kMax}) {
      Sequential fused(dev());
      fused.Add("conv", std::make_unique<Conv2dActivationPool>(dev(), 2, 4, 5, 1, 2, act, pool,
                                                               3, 2, 1));
      Sequential unfused(dev());
      unfused.Add("conv", std::make_unique<Conv2d>(dev(), 2, 4, 5, 1, 2));
      unfused.Add("", std::make_unique<Activation>(dev(), act));
      unfused.Add("", std::make_unique<Pool2d>(dev(), pool, 3, 2, 1));
      auto fused_params = ParameterSet::Create(fused, dev());
      auto unfused_params = ParameterSet::Create(unfused, dev());
      ASSERT_TRUE(fused_params.ok() && unfused_params.ok());
      EXPECT_EQ((*fused_params)->parameters(), (*unfused_params)->parameters());
      ASSERT_TRUE((*fused_params)->Initialize(3).ok());
      ASSERT_TRUE((*unfused_params)->Initialize(3).ok());
      // Non-zero biases.
      const std::vector<float> p = Uniform((*fused_params)->flat_parameters().num_elements(), 9);
      ASSERT_TRUE((*fused_params)->flat_parameters().CopyFromHost(p).ok());
      ASSERT_TRUE((*unfused_params)->flat_parameters().CopyFromHost(p).ok());
      Tensor xt = DeviceTensor(dev(), shape, x);
      auto y_fused = fused.Forward(xt, Mode::kTraining);
      auto y_unfused = unfused.Forward(xt, Mode::kTraining);
      ASSERT_TRUE(y_fused.ok() && y_unfused.ok()) << y_fused.status() << y_unfused.status();
      ASSERT_EQ(y_fused->shape(), y_unfused->shape());
      EXPECT_EQ(HostValues(*y_fused), HostValues(*y_unfused));
      Tensor dy = DeviceTensor(dev(), y_fused->shape(), Uniform(y_fused->num_elements(), 10));
      auto dx_fused = fused.Backward(dy, true);
      auto dx_unfused = unfused.Backward(dy, true);
      ASSERT_TRUE(dx_fused.ok() && dx_unfused.ok());
      EXPECT_EQ(HostValues(*dx_fused), HostValues(*dx_unfused));
      EXPECT_EQ(HostValues((*fused_params)->flat_gradients()),
                HostValues((*unfused_params)->flat_gradients()));
    }
  }
}

TEST_F(LayerTest, BatchNorm2dGradients) {
  BatchNorm bn(dev(), 4, 2);
  CheckLayerGradients(dev(), bn, {3, 4, 3, 3}, CheckOptions().Eps(3e-3).Atol(2e-3));
}

TEST_F(LayerTest, BatchNorm1dGradients) {
  BatchNorm bn(dev(), 4, 0);
  CheckLayerGradients(dev(), bn, {5, 4}, CheckOptions().Eps(3e-3).Atol(2e-3));
}

TEST_F(LayerTest, FlattenGradients) {
  Flatten flatten(dev());
  CheckLayerGradients(dev(), flatten, {2, 3, 2, 2}, CheckOptions());
}

TEST_F(LayerTest, ResidualIdentityShortcutGradients) {
  Residual block(dev(), 3, 3, /*use_1x1conv=*/false, 1);
  CheckLayerGradients(dev(), block, {2, 3, 4, 4}, CheckOptions().Eps(1e-3).Atol(2e-3));
}

TEST_F(LayerTest, ResidualProjectionShortcutGradients) {
  Residual block(dev(), 3, 4, /*use_1x1conv=*/true, 2);
  CheckLayerGradients(dev(), block, {2, 3, 5, 5}, CheckOptions().Eps(1e-3).Atol(2e-3));
}

TEST_F(LayerTest, SequentialGradientsAndNames) {
  Sequential net(dev());
  net.Add("conv", std::make_unique<Conv2d>(dev(), 1, 2, 3, 1, 1));
  net.Add("", std::make_unique<Activation>(dev(), Activation::Kind::kSigmoid));
  net.Add("", std::make_unique<Flatten>(dev()));
  net.Add("fc", std::make_unique<Linear>(dev(), 2 * 4 * 4, 3));
  CheckLayerGradients(dev(), net, {2, 1, 4, 4}, CheckOptions());

  absl::StatusOr<std::unique_ptr<ParameterSet>> params = ParameterSet::Create(net, dev());
  ASSERT_TRUE(params.ok());
  std::vector<std::string> names;
  for (const ParamSpec& spec : (*params)->parameters()) names.push_back(spec.name);
  EXPECT_EQ(names, (std::vector<std::string>{"conv.weight", "conv.bias", "fc.weight", "fc.bias"}));
}

// A Linear of at least two blocks of output features on a CPU device
// (1,100: blocks of 512, 512 and 76) computes in blocks; its gradients are
// still right.
TEST_F(LayerTest, BlockedLinearGradients) {
  Linear linear(dev(), 8, 1100, /*block_rows=*/512);
  EXPECT_TRUE(linear.AwaitsParametersInParts());
  CheckLayerGradients(dev(), linear, {3, 8}, CheckOptions());
}

// ... and asks for its weight block by block from the last (the order its
// backward hands them over in) and its bias last in the forward pass, hands
// its gradients over bias first, then weight blocks from the last, and
// gives the same bits whether anyone listens or not.
TEST_F(LayerTest, BlockedLinearWaitsAndHandsOverInBlocksWithTheSameValues) {
  constexpr int64_t kIn = 8, kOut = 1100, kWeight = kIn * kOut;
  Linear linear(dev(), kIn, kOut, /*block_rows=*/512);
  auto params = ParameterSet::Create(linear, dev());
  ASSERT_TRUE(params.ok());
  ASSERT_TRUE((*params)->Initialize(11).ok());
  Tensor x = DeviceTensor(dev(), {4, kIn}, Uniform(4 * kIn, 5));
  Tensor dy = DeviceTensor(dev(), {4, kOut}, Uniform(4 * kOut, 6));
  auto pass = [&](std::vector<float>* y, std::vector<float>* grads, std::vector<float>* dx) {
    auto out = linear.Forward(x, Mode::kTraining);
    ASSERT_TRUE(out.ok()) << out.status();
    *y = HostValues(*out);
    auto g = linear.Backward(dy, true);
    ASSERT_TRUE(g.ok()) << g.status();
    *dx = HostValues(*g);
    *grads = HostValues((*params)->flat_gradients());
  };
  std::vector<float> y0, grads0, dx0, y1, grads1, dx1;
  pass(&y0, &grads0, &dx0);
  std::vector<std::pair<int64_t, int64_t>> needed;
  std::vector<int64_t> ready;
  const std::function<absl::Status(int64_t, int64_t)> on_needed = [&](int64_t from, int64_t to) {
    needed.emplace_back(from, to);
    return absl::OkStatus();
  };
  const std::function<void(int64_t)> on_ready = [&](int64_t from) { ready.push_back(from); };
  linear.set_parameters_needed(&on_needed);
  linear.set_gradients_ready(&on_ready);
  pass(&y1, &grads1, &dx1);
  linear.set_parameters_needed(nullptr);
  linear.set_gradients_ready(nullptr);
  EXPECT_EQ(needed, (std::vector<std::pair<int64_t, int64_t>>{{1024 * kIn, kWeight},
                                                              {512 * kIn, 1024 * kIn},
                                                              {0, 512 * kIn},
                                                              {kWeight, kWeight + kOut}}));
  EXPECT_EQ(ready, (std::vector<int64_t>{kWeight, 1024 * kIn, 512 * kIn, 0}));
  EXPECT_EQ(y1, y0);
  EXPECT_EQ(grads1, grads0);
  EXPECT_EQ(dx1, dx0);
  // A refusal while waiting ends the pass with it.
  const std::function<absl::Status(int64_t, int64_t)> refuse = [](int64_t from, int64_t) {
    return from > 0 ? absl::CancelledError("no parameters") : absl::OkStatus();
  };
  linear.set_parameters_needed(&refuse);
  EXPECT_EQ(linear.Forward(x, Mode::kTraining).status().code(), absl::StatusCode::kCancelled);
  linear.set_parameters_needed(nullptr);
  // A layer of fewer than two blocks waits whole, as every other layer,
  // and so does one without blocks.
  EXPECT_FALSE(Linear(dev(), kIn, 1023, 512).AwaitsParametersInParts());
  EXPECT_FALSE(Linear(dev(), kIn, kOut).AwaitsParametersInParts());
}

// --- behaviour beyond gradients ---

TEST_F(LayerTest, BackwardWithoutInputGradientStillWritesParameterGradients) {
  Conv2d conv(dev(), 2, 3, 3, 1, 1);
  auto params = ParameterSet::Create(conv, dev());
  ASSERT_TRUE(params.ok());
  ASSERT_TRUE((*params)->Initialize(7).ok());
  Tensor x = DeviceTensor(dev(), {2, 2, 4, 4}, Uniform(64, 3));
  auto y = conv.Forward(x, Mode::kTraining);
  ASSERT_TRUE(y.ok());
  Tensor dy = DeviceTensor(dev(), y->shape(), Uniform(y->num_elements(), 4));
  ASSERT_TRUE(conv.Backward(dy, true).ok());
  const std::vector<float> with_dx = HostValues((*params)->flat_gradients());
  ASSERT_TRUE((*params)->flat_gradients().SetZero().ok());
  auto dx = conv.Backward(dy, false);
  ASSERT_TRUE(dx.ok());
  EXPECT_TRUE(dx->empty());
  EXPECT_EQ(HostValues((*params)->flat_gradients()), with_dx);
}

TEST_F(LayerTest, BatchNormRunningStatisticsAndInference) {
  const int64_t n = 4, c = 2, s = 3;
  BatchNorm bn(dev(), c, 2);
  auto params = ParameterSet::Create(bn, dev());
  ASSERT_TRUE(params.ok());
  ASSERT_TRUE((*params)->Initialize(0).ok());
  std::vector<std::string> buffer_names;
  for (const ParamSpec& spec : (*params)->buffers()) buffer_names.push_back(spec.name);
  EXPECT_EQ(buffer_names,
            (std::vector<std::string>{"running_mean", "running_var", "num_batches_tracked"}));
  EXPECT_EQ((*params)->buffers()[2].shape, Shape{});  // a scalar, as in PyTorch
  EXPECT_EQ(HostValues((*params)->flat_buffers()), (std::vector<float>{0, 0, 1, 1, 0}));
  const std::vector<float> gamma_beta = {1.5f, -0.5f, 0.25f, 2.0f};
  ASSERT_TRUE((*params)->flat_parameters().CopyFromHost(gamma_beta).ok());

  const std::vector<float> x = Uniform(n * c * s, 11, -2, 3);
  Tensor xt = DeviceTensor(dev(), {n, c, 1, s}, x);
  std::vector<double> mean(c, 0), var(c, 0);
  for (int64_t ch = 0; ch < c; ++ch) {
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t k = 0; k < s; ++k) mean[ch] += x[(i * c + ch) * s + k];
    }
    mean[ch] /= n * s;
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t k = 0; k < s; ++k) {
        var[ch] += std::pow(x[(i * c + ch) * s + k] - mean[ch], 2);
      }
    }
    var[ch] /= n * s;  // biased
  }

  // Two training steps on the same batch.
  for (int step = 1; step <= 2; ++step) ASSERT_TRUE(bn.Forward(xt, Mode::kTraining).ok());
  std::vector<float> buffers = HostValues((*params)->flat_buffers());
  const double m = n * s;
  for (int64_t ch = 0; ch < c; ++ch) {
    double rm = 0, rv = 1;
    for (int step = 0; step < 2; ++step) {
      rm = 0.9 * rm + 0.1 * mean[ch];
      rv = 0.9 * rv + 0.1 * var[ch] * m / (m - 1);
    }
    EXPECT_NEAR(buffers[ch], rm, 1e-5) << "running_mean " << ch;
    EXPECT_NEAR(buffers[c + ch], rv, 1e-5) << "running_var " << ch;
  }
  EXPECT_EQ(buffers[2 * c], 2.0f) << "num_batches_tracked";

  // Inference normalises with the running statistics and counts nothing.
  auto y = bn.Forward(xt, Mode::kInference);
  ASSERT_TRUE(y.ok());
  const std::vector<float> yh = HostValues(*y);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t ch = 0; ch < c; ++ch) {
      for (int64_t k = 0; k < s; ++k) {
        const int64_t j = (i * c + ch) * s + k;
        const double expected =
            gamma_beta[ch] * (x[j] - buffers[ch]) / std::sqrt(buffers[c + ch] + 1e-5) +
            gamma_beta[c + ch];
        EXPECT_NEAR(yh[j], expected, 1e-4) << j;
      }
    }
  }
  EXPECT_EQ(HostValues((*params)->flat_buffers()), buffers);
  // Backward after an inference forward has no batch statistics to use.
  Tensor dy = DeviceTensor(dev(), y->shape(), Uniform(y->num_elements(), 2));
  EXPECT_EQ(bn.Backward(dy, true).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(LayerTest, BackwardBeforeForwardFails) {
  Linear linear(dev(), 3, 2);
  auto params = ParameterSet::Create(linear, dev());
  ASSERT_TRUE(params.ok());
  Tensor dy = DeviceTensor(dev(), {1, 2}, {1, 1});
  EXPECT_EQ(linear.Backward(dy, true).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(LayerTest, OutputShapeErrorsNameLayerAndShape) {
  Conv2d conv(dev(), 3, 4, 3);
  absl::StatusOr<Shape> out = conv.OutputShape({2, 1, 8, 8});
  ASSERT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(out.status().message().find("Conv2d(3, 4"), std::string::npos) << out.status();
  EXPECT_NE(out.status().message().find("[2, 1, 8, 8]"), std::string::npos) << out.status();
  EXPECT_FALSE(conv.OutputShape({2, 3, 2, 2}).ok());  // output would be empty
  EXPECT_FALSE(Linear(dev(), 4, 2).OutputShape({2, 5}).ok());
  EXPECT_FALSE(Pool2d(dev(), Pool2d::Kind::kMax, 3, 2, 1).OutputShape({1, 1, 5}).ok());
  EXPECT_FALSE(BatchNorm(dev(), 4, 2).OutputShape({2, 4}).ok());
  EXPECT_FALSE(BatchNorm(dev(), 4, 0).OutputShape({2, 3}).ok());
  EXPECT_FALSE(Residual(dev(), 3, 4, false, 1).OutputShape({1, 3, 4, 4}).ok());
  EXPECT_EQ(*Residual(dev(), 3, 4, true, 2).OutputShape({1, 3, 5, 5}), (Shape{1, 4, 3, 3}));
  // A forward pass reports the same error instead of running.
  Tensor x = DeviceTensor(dev(), {1, 1, 4, 4}, Uniform(16, 1));
  EXPECT_EQ(conv.Forward(x, Mode::kTraining).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(LayerTest, ActivationBufferGrowsOnlyWhenNeeded) {
  ActivationBuffer buffer;
  auto a = buffer.Get(dev(), {4, 3});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(buffer.capacity(), 12);
  auto b = buffer.Get(dev(), {2, 3});
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->shape(), (Shape{2, 3}));
  EXPECT_EQ(b->raw_data(), a->raw_data());  // reused, no allocation
  EXPECT_EQ(buffer.capacity(), 12);
  auto c = buffer.Get(dev(), {8, 3});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(buffer.capacity(), 24);
  auto d = buffer.Get(dev(), {5, 3});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->raw_data(), c->raw_data());
}

// A layer's output for a sample does not depend on the batch it came in, and
// the batch size may shrink and grow between calls.
TEST_F(LayerTest, BatchSizeMayChangeBetweenCalls) {
  Sequential net(dev());
  net.Add("conv", std::make_unique<Conv2d>(dev(), 1, 2, 3, 1, 1));
  net.Add("", std::make_unique<Activation>(dev(), Activation::Kind::kRelu));
  net.Add("", std::make_unique<Pool2d>(dev(), Pool2d::Kind::kMax, 2, 2));
  net.Add("", std::make_unique<Flatten>(dev()));
  net.Add("fc", std::make_unique<Linear>(dev(), 8, 3));
  auto params = ParameterSet::Create(net, dev());
  ASSERT_TRUE(params.ok());
  ASSERT_TRUE((*params)->Initialize(5).ok());
  const std::vector<float> x = Uniform(4 * 16, 9);
  std::vector<float> full;
  for (int64_t n : {4, 1, 3, 4, 2}) {
    Tensor xt = DeviceTensor(dev(), {n, 1, 4, 4}, absl::MakeConstSpan(x.data(), n * 16));
    auto y = net.Forward(xt, Mode::kTraining);
    ASSERT_TRUE(y.ok()) << y.status();
    ASSERT_EQ(y->shape(), (Shape{n, 3}));
    std::vector<float> yh = HostValues(*y);
    if (full.empty()) full = yh;
    // Equal up to rounding: GEMM blocking may depend on the batch size.
    for (int64_t i = 0; i < n * 3; ++i) EXPECT_NEAR(yh[i], full[i], 1e-6) << "n=" << n;
    Tensor dy = DeviceTensor(dev(), y->shape(), std::vector<float>(n * 3, 1.0f));
    auto dx = net.Backward(dy, true);
    ASSERT_TRUE(dx.ok()) << dx.status();
    EXPECT_EQ(dx->shape(), (Shape{n, 1, 4, 4}));
  }
}

// --- ParameterSet ---

TEST_F(LayerTest, InitializeIsDeterministicXavierUniform) {
  Sequential net(dev());
  net.Add("conv", std::make_unique<Conv2d>(dev(), 3, 8, 5));
  net.Add("bn", std::make_unique<BatchNorm>(dev(), 8, 2));
  net.Add("", std::make_unique<Flatten>(dev()));
  net.Add("fc", std::make_unique<Linear>(dev(), 200, 50));
  auto a = ParameterSet::Create(net, dev());
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE((*a)->Initialize(123).ok());
  const std::vector<float> first = HostValues((*a)->flat_parameters());
  ASSERT_TRUE((*a)->Initialize(123).ok());
  EXPECT_EQ(HostValues((*a)->flat_parameters()), first);
  ASSERT_TRUE((*a)->Initialize(124).ok());
  EXPECT_NE(HostValues((*a)->flat_parameters()), first);
  ASSERT_TRUE((*a)->Initialize(123).ok());

  auto check = [&](const std::string& name, double bound, bool xavier) {
    auto t = (*a)->Find(name);
    ASSERT_TRUE(t.ok()) << t.status();
    const std::vector<float> v = HostValues(*t);
    double sum = 0, sum_sq = 0, max_abs = 0;
    for (float x : v) {
      sum += x;
      sum_sq += double(x) * x;
      max_abs = std::max(max_abs, std::fabs(double(x)));
    }
    if (xavier) {
      EXPECT_LE(max_abs, bound) << name;
      EXPECT_GT(max_abs, 0.95 * bound) << name;
      // U(-b, b): mean 0, variance b^2 / 3.
      EXPECT_NEAR(sum / v.size(), 0, 0.1 * bound) << name;
      EXPECT_NEAR(sum_sq / v.size(), bound * bound / 3, 0.15 * bound * bound / 3) << name;
    } else {
      for (float x : v) EXPECT_EQ(x, bound) << name;
    }
  };
  check("conv.weight", std::sqrt(6.0 / (3 * 25 + 8 * 25)), true);
  check("conv.bias", 0, false);
  check("bn.weight", 1, false);
  check("bn.bias", 0, false);
  check("fc.weight", std::sqrt(6.0 / (200 + 50)), true);
  check("fc.bias", 0, false);
  check("bn.running_mean", 0, false);
  check("bn.running_var", 1, false);
  check("bn.num_batches_tracked", 0, false);
  EXPECT_EQ((*a)->Find("fc.nothing").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*a)->FindGradient("bn.running_mean").status().code(), absl::StatusCode::kNotFound);

  // Views: the parameter and its gradient share the flat buffers' layout.
  auto fc_bias = (*a)->Find("fc.bias");
  auto fc_bias_grad = (*a)->FindGradient("fc.bias");
  ASSERT_TRUE(fc_bias.ok() && fc_bias_grad.ok());
  const int64_t offset = (*a)->flat_parameters().num_elements() - 50;
  EXPECT_EQ(fc_bias->data<float>(), (*a)->flat_parameters().data<float>() + offset);
  EXPECT_EQ(fc_bias_grad->data<float>(), (*a)->flat_gradients().data<float>() + offset);
}

TEST_F(LayerTest, DuplicateNamesAreRejected) {
  Sequential net(dev());
  net.Add("fc", std::make_unique<Linear>(dev(), 2, 2));
  net.Add("fc", std::make_unique<Linear>(dev(), 2, 2));
  EXPECT_EQ(ParameterSet::Create(net, dev()).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ps::worker::model
