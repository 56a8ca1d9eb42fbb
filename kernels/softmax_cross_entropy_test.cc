#include "kernels/softmax_cross_entropy.h"

#include <cmath>
#include <vector>

#include "common/cpu_device.h"
#include "kernels/test_util.h"

namespace ps::kernels {
namespace {

using testing::AllClose;
using testing::DeviceBuffer;
using testing::RandomVector;

struct NaiveSce {
  double loss_sum = 0;
  int64_t correct = 0;
  std::vector<float> dlogits;
  std::vector<int32_t> argmax;
};

// Straight from the definitions, in double. Inputs are moderate, so the
// unshifted exp() cannot overflow here.
NaiveSce Naive(int64_t n, int64_t k, const std::vector<float>& logits,
               const std::vector<int32_t>& labels, double grad_scale) {
  NaiveSce out;
  out.dlogits.assign(n * k, 0.f);
  for (int64_t i = 0; i < n; ++i) {
    const float* x = &logits[i * k];
    double z = 0;
    int32_t best = 0;
    for (int64_t j = 0; j < k; ++j) {
      z += std::exp(double(x[j]));
      if (x[j] > x[best]) best = static_cast<int32_t>(j);
    }
    out.argmax.push_back(best);
    const int32_t label = labels[i];
    if (label < 0 || label >= k) continue;
    out.loss_sum += -std::log(std::exp(double(x[label])) / z);
    out.correct += best == label;
    for (int64_t j = 0; j < k; ++j) {
      out.dlogits[i * k + j] =
          static_cast<float>(grad_scale * (std::exp(double(x[j])) / z - (j == label)));
    }
  }
  return out;
}

std::vector<int32_t> RandomLabels(int64_t n, int64_t k, uint64_t seed) {
  const std::vector<float> u = RandomVector(n, seed, 0.f, 1.f);
  std::vector<int32_t> labels(n);
  for (int64_t i = 0; i < n; ++i) {
    labels[i] = std::min<int32_t>(static_cast<int32_t>(u[i] * k), static_cast<int32_t>(k - 1));
  }
  return labels;
}

TEST(SoftmaxCrossEntropyCpuTest, HandComputed) {
  CpuDevice cpu(0, 1);
  // softmax(1, 2, 3) = (0.0900306, 0.2447285, 0.6652410).
  const std::vector<float> logits = {1, 2, 3, 3, 2, 1, 1, 1, 1};
  const std::vector<int32_t> labels = {2, 0, 1};
  float loss = -1, correct = -1;
  std::vector<float> d(9);
  ASSERT_TRUE(
      SoftmaxCrossEntropy(cpu, 3, 3, logits.data(), labels.data(), 0.5f, &loss, &correct, d.data())
          .ok());
  // -log 0.6652410 twice, plus log 3 for the uniform row, whose first maximum
  // (class 0) is not its label.
  EXPECT_NEAR(loss, 2 * 0.4076059644 + 1.0986122887, 1e-6);
  EXPECT_EQ(correct, 2.f);
  EXPECT_TRUE(AllClose(
      d,
      {0.5f * 0.0900306f, 0.5f * 0.2447285f, 0.5f * (0.6652410f - 1), 0.5f * (0.6652410f - 1),
       0.5f * 0.2447285f, 0.5f * 0.0900306f, 0.5f / 3, 0.5f * (1.f / 3 - 1), 0.5f / 3},
      1e-6f, 1e-5f));

  std::vector<int32_t> pred(3);
  ASSERT_TRUE(ArgmaxRows(cpu, 3, 3, logits.data(), pred.data()).ok());
  EXPECT_EQ(pred, (std::vector<int32_t>{2, 0, 0}));
}

TEST(SoftmaxCrossEntropyCpuTest, ExtremeLogitsStayFinite) {
  CpuDevice cpu(0, 1);
  const std::vector<float> logits = {1e4f, -1e4f, 0.f, 1e4f, -1e4f, 0.f, -1e4f, -1e4f, -1e4f};
  const std::vector<int32_t> labels = {0, 1, 2};
  float loss = -1, correct = -1;
  std::vector<float> d(9);
  ASSERT_TRUE(
      SoftmaxCrossEntropy(cpu, 3, 3, logits.data(), labels.data(), 1.f, &loss, &correct, d.data())
          .ok());
  // Row 0: loss 0; row 1: 1e4 - (-1e4) = 2e4; row 2: uniform, log 3.
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_NEAR(loss, 2e4 + std::log(3.0), 2e4 * 1e-6);
  EXPECT_EQ(correct, 1.f);
  for (float v : d) EXPECT_TRUE(std::isfinite(v)) << v;
  EXPECT_TRUE(AllClose(d, {0, 0, 0, 1, -1, 0, 1.f / 3, 1.f / 3, 1.f / 3 - 1}, 1e-6f, 1e-6f));
}

TEST(SoftmaxCrossEntropyCpuTest, MatchesNaiveReference) {
  CpuDevice cpu(0, 2);
  const struct { int64_t n, k; } cases[] = {{1000, 10}, {300, 1000}, {7, 1}, {65, 3}};
  for (const auto& c : cases) {
    SCOPED_TRACE(::testing::Message() << "N" << c.n << " K" << c.k);
    const std::vector<float> logits = RandomVector(c.n * c.k, 1, -8.f, 8.f);
    std::vector<int32_t> labels = RandomLabels(c.n, c.k, 2);
    labels[0] = -1;  // rejected labels contribute nothing
    if (c.n > 3) labels[3] = static_cast<int32_t>(c.k);
    const float grad_scale = 1.f / c.n;
    const NaiveSce ref = Naive(c.n, c.k, logits, labels, grad_scale);

    float loss = -1, correct = -1;
    std::vector<float> d(c.n * c.k, 7.f);
    ASSERT_TRUE(SoftmaxCrossEntropy(cpu, c.n, c.k, logits.data(), labels.data(), grad_scale, &loss,
                                    &correct, d.data())
                    .ok());
    EXPECT_TRUE(AllClose({loss}, {static_cast<float>(ref.loss_sum)}, 1e-5f, 1e-6f));
    EXPECT_EQ(correct, static_cast<float>(ref.correct));
    EXPECT_TRUE(AllClose(d, ref.dlogits, 1e-8f, 1e-5f));

    // Without dlogits, the same scalars.
    float loss2 = -1, correct2 = -1;
    ASSERT_TRUE(SoftmaxCrossEntropy(cpu, c.n, c.k, logits.data(), labels.data(), grad_scale, &loss2,
                                    &correct2, nullptr)
                    .ok());
    EXPECT_EQ(loss2, loss);
    EXPECT_EQ(correct2, correct);

    std::vector<int32_t> pred(c.n);
    ASSERT_TRUE(ArgmaxRows(cpu, c.n, c.k, logits.data(), pred.data()).ok());
    EXPECT_EQ(pred, ref.argmax);
  }
}

TEST(SoftmaxCrossEntropyCpuTest, LossDoesNotDependOnThreadCount) {
  const int64_t n = 5000, k = 100;
  const std::vector<float> logits = RandomVector(n * k, 3, -5.f, 5.f);
  const std::vector<int32_t> labels = RandomLabels(n, k, 4);
  float loss1, loss2, correct1, correct2;
  CpuDevice one(0, 1), two(1, 2);
  ASSERT_TRUE(
      SoftmaxCrossEntropy(one, n, k, logits.data(), labels.data(), 1.f, &loss1, &correct1, nullptr)
          .ok());
  ASSERT_TRUE(
      SoftmaxCrossEntropy(two, n, k, logits.data(), labels.data(), 1.f, &loss2, &correct2, nullptr)
          .ok());
  EXPECT_EQ(loss1, loss2);
  EXPECT_EQ(correct1, correct2);
}

// Central differences of loss_sum against dlogits (grad_scale 1).
TEST(SoftmaxCrossEntropyCpuTest, GradientMatchesFiniteDifferences) {
  CpuDevice cpu(0, 1);
  const int64_t n = 4, k = 5;
  const std::vector<float> logits = RandomVector(n * k, 5, -2.f, 2.f);
  const std::vector<int32_t> labels = {0, 4, 2, 2};
  auto loss_at = [&](const std::vector<float>& x) {
    float loss = 0, correct = 0;
    EXPECT_TRUE(
        SoftmaxCrossEntropy(cpu, n, k, x.data(), labels.data(), 1.f, &loss, &correct, nullptr)
            .ok());
    return double(loss);
  };
  const float h = 1e-2f;
  std::vector<float> numeric(n * k);
  for (int64_t i = 0; i < n * k; ++i) {
    std::vector<float> xp = logits, xm = logits;
    xp[i] += h;
    xm[i] -= h;
    numeric[i] = static_cast<float>((loss_at(xp) - loss_at(xm)) / (2 * h));
  }
  float loss, correct;
  std::vector<float> d(n * k);
  ASSERT_TRUE(
      SoftmaxCrossEntropy(cpu, n, k, logits.data(), labels.data(), 1.f, &loss, &correct, d.data())
          .ok());
  EXPECT_TRUE(AllClose(d, numeric, 2e-4f, 1e-3f));
}

TEST(SoftmaxCrossEntropyCpuTest, EmptyBatchWritesZeros) {
  CpuDevice cpu(0, 1);
  float loss = -1, correct = -1;
  ASSERT_TRUE(
      SoftmaxCrossEntropy(cpu, 0, 10, nullptr, nullptr, 1.f, &loss, &correct, nullptr).ok());
  EXPECT_EQ(loss, 0.f);
  EXPECT_EQ(correct, 0.f);
}

TEST(SoftmaxCrossEntropyCpuTest, ValidationNamesTheField) {
  CpuDevice cpu(0, 1);
  float f = 0;
  int32_t i = 0;
  absl::Status s = SoftmaxCrossEntropy(cpu, 1, 0, &f, &i, 1.f, &f, &f, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("classes"), absl::string_view::npos) << s;
  s = SoftmaxCrossEntropy(cpu, -2, 3, &f, &i, 1.f, &f, &f, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("batch"), absl::string_view::npos) << s;
  s = ArgmaxRows(cpu, 1, int64_t{1} << 32, &f, &i);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("classes"), absl::string_view::npos) << s;
}

TEST(SoftmaxCrossEntropyCudaTest, MatchesCpu) {
  PS_SKIP_WITHOUT_GPU();
  Device* gpu = testing::TestGpu();
  CpuDevice cpu(0, 2);
  const struct {
    int64_t n, k;
    float lo, hi;
  } cases[] = {
      {1000, 10, -8.f, 8.f},  {257, 1000, -8.f, 8.f}, {5, 1, -1.f, 1.f},
      {20000, 10, -8.f, 8.f},  // more rows than first-pass warps: grid-stride loop
      {64, 33, -1e4f, 1e4f},   // extreme logits
      {0, 10, -1.f, 1.f},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(::testing::Message() << "N" << c.n << " K" << c.k << " range " << c.hi);
    const int64_t nk = c.n * c.k;
    const std::vector<float> logits = RandomVector(nk, 11, c.lo, c.hi);
    std::vector<int32_t> labels = RandomLabels(c.n, c.k, 12);
    if (c.n > 2) {
      labels[1] = -3;
      labels[2] = static_cast<int32_t>(c.k);
    }
    const float grad_scale = 1.f / 128;
    float loss = -1, correct = -1;
    std::vector<float> d(nk);
    ASSERT_TRUE(SoftmaxCrossEntropy(cpu, c.n, c.k, logits.data(), labels.data(), grad_scale, &loss,
                                    &correct, d.data())
                    .ok());

    DeviceBuffer g_logits(gpu, logits), g_d(gpu, nk), g_loss(gpu, 1), g_correct(gpu, 1);
    auto label_mem = gpu->Allocate((c.n + 1) * sizeof(int32_t));
    ASSERT_TRUE(label_mem.ok()) << label_mem.status();
    int32_t* g_labels = static_cast<int32_t*>(*label_mem);
    ASSERT_TRUE(gpu->CopyHostToDevice(g_labels, labels.data(), c.n * sizeof(int32_t)).ok());
    ASSERT_TRUE(SoftmaxCrossEntropy(*gpu, c.n, c.k, g_logits.data(), g_labels, grad_scale,
                                    g_loss.data(), g_correct.data(), g_d.data())
                    .ok());
    const std::vector<float> gpu_loss = g_loss.ToHost();
    EXPECT_TRUE(AllClose(gpu_loss, {loss}, 1e-4f, 1e-5f));
    EXPECT_TRUE(std::isfinite(gpu_loss[0]));
    EXPECT_EQ(g_correct.ToHost()[0], correct);
    const std::vector<float> gpu_d = g_d.ToHost();
    EXPECT_TRUE(AllClose(gpu_d, d, 1e-8f, 1e-5f));
    for (float v : gpu_d) ASSERT_TRUE(std::isfinite(v));

    // Deterministic: a second run (without dlogits) gives the same bits.
    ASSERT_TRUE(SoftmaxCrossEntropy(*gpu, c.n, c.k, g_logits.data(), g_labels, grad_scale,
                                    g_loss.data(), g_correct.data(), nullptr)
                    .ok());
    EXPECT_EQ(g_loss.ToHost()[0], gpu_loss[0]);

    std::vector<int32_t> pred(c.n), gpu_pred(c.n);
    ASSERT_TRUE(ArgmaxRows(cpu, c.n, c.k, logits.data(), pred.data()).ok());
    ASSERT_TRUE(ArgmaxRows(*gpu, c.n, c.k, g_logits.data(), g_labels).ok());
    ASSERT_TRUE(gpu->Synchronize().ok());
    ASSERT_TRUE(gpu->CopyDeviceToHost(gpu_pred.data(), g_labels, c.n * sizeof(int32_t)).ok());
    EXPECT_EQ(gpu_pred, pred);
    gpu->Deallocate(g_labels);
  }

  // Ties: the first maximum, as on the CPU, whatever lane holds it.
  std::vector<float> tied(2 * 100, 0.f);
  tied[37] = tied[69] = 5.f;  // row 0: columns 37 and 69 (lanes 5 and 5)
  tied[100 + 3] = 1.f;        // row 1: columns 3 and 40 (lanes 3 and 8)
  tied[100 + 40] = 1.f;
  DeviceBuffer g_tied(gpu, tied);
  auto pred_mem = gpu->Allocate(2 * sizeof(int32_t));
  ASSERT_TRUE(pred_mem.ok());
  ASSERT_TRUE(ArgmaxRows(*gpu, 2, 100, g_tied.data(), static_cast<int32_t*>(*pred_mem)).ok());
  std::vector<int32_t> pred(2);
  ASSERT_TRUE(gpu->Synchronize().ok());
  ASSERT_TRUE(gpu->CopyDeviceToHost(pred.data(), *pred_mem, 2 * sizeof(int32_t)).ok());
  EXPECT_EQ(pred, (std::vector<int32_t>{37, 3}));
  gpu->Deallocate(*pred_mem);
}

}  // namespace
}  // namespace ps::kernels
