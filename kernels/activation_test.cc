#include "kernels/activation.h"

#include <cmath>
#include <limits>
#include <vector>

#include "common/cpu_device.h"
#include "kernels/test_util.h"

namespace ps::kernels {
namespace {

using testing::AllClose;
using testing::DeviceBuffer;
using testing::RandomVector;

double NaiveSigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// sum_i w[i] * y[i] in double: a scalar loss whose gradient w.r.t. y is w.
double WeightedSum(const std::vector<float>& w, const std::vector<float>& y) {
  double s = 0;
  for (size_t i = 0; i < y.size(); ++i) s += double(w[i]) * y[i];
  return s;
}

TEST(ActivationCpuTest, ReluHandCases) {
  CpuDevice cpu(0, 2);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> x = {-2.f, -0.f, 0.f, 1.5f, 3e38f, nan}, y(x.size());
  ASSERT_TRUE(ReluForward(cpu, x.size(), x.data(), y.data()).ok());
  EXPECT_TRUE(AllClose(y, {0.f, 0.f, 0.f, 1.5f, 3e38f, nan}, 0, 0));

  std::vector<float> dy = {1, 2, 3, 4, 5, 6}, dx(x.size());
  ASSERT_TRUE(ReluBackward(cpu, x.size(), y.data(), dy.data(), dx.data()).ok());
  EXPECT_TRUE(AllClose(dx, {0, 0, 0, 4, 5, 0}, 0, 0));
}

TEST(ActivationCpuTest, ReluInPlaceAndAliasedBackward) {
  CpuDevice cpu(0, 2);
  std::vector<float> x = {-1.f, 2.f, -3.f, 4.f};
  ASSERT_TRUE(ReluForward(cpu, 4, x.data(), x.data()).ok());
  EXPECT_TRUE(AllClose(x, {0, 2, 0, 4}, 0, 0));
  std::vector<float> g = {10, 20, 30, 40};
  ASSERT_TRUE(ReluBackward(cpu, 4, x.data(), g.data(), g.data()).ok());
  EXPECT_TRUE(AllClose(g, {0, 20, 0, 40}, 0, 0));
}

TEST(ActivationCpuTest, SigmoidIsStableForLargeMagnitudes) {
  CpuDevice cpu(0, 1);
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x = {0.f,    1.f,  -1.f,  20.f,  -20.f,  88.f, -88.f, 100.f,
                          -100.f, 1e4f, -1e4f, 3e38f, -3e38f, inf,  -inf};
  std::vector<float> y(x.size());
  ASSERT_TRUE(SigmoidForward(cpu, x.size(), x.data(), y.data()).ok());
  std::vector<float> expected(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_TRUE(std::isfinite(y[i])) << "x = " << x[i] << " gave " << y[i];
    expected[i] = static_cast<float>(NaiveSigmoid(x[i]));
  }
  EXPECT_FLOAT_EQ(y[0], 0.5f);
  EXPECT_EQ(y[9], 1.f);
  EXPECT_EQ(y[10], 0.f);
  // Tiny outputs (sigmoid(-20) ~ 2e-9) must be right relatively, not just
  // absolutely: the stable branch computes them as e^x / (1 + e^x).
  EXPECT_TRUE(AllClose(y, expected, 1e-30f, 2e-7f));
}

TEST(ActivationCpuTest, MatchesNaiveReference) {
  CpuDevice cpu(0, 2);
  const int64_t n = 100'003;  // spans several ParallelFor chunks
  std::vector<float> x = RandomVector(n, 7, -8.f, 8.f), dy = RandomVector(n, 8);
  std::vector<float> y(n), dx(n), ref_y(n), ref_dx(n);

  ASSERT_TRUE(ReluForward(cpu, n, x.data(), y.data()).ok());
  ASSERT_TRUE(ReluBackward(cpu, n, y.data(), dy.data(), dx.data()).ok());
  for (int64_t i = 0; i < n; ++i) {
    ref_y[i] = x[i] > 0 ? x[i] : 0.f;
    ref_dx[i] = x[i] > 0 ? dy[i] : 0.f;
  }
  EXPECT_TRUE(AllClose(y, ref_y, 0, 0));
  EXPECT_TRUE(AllClose(dx, ref_dx, 0, 0));

  ASSERT_TRUE(SigmoidForward(cpu, n, x.data(), y.data()).ok());
  ASSERT_TRUE(SigmoidBackward(cpu, n, y.data(), dy.data(), dx.data()).ok());
  for (int64_t i = 0; i < n; ++i) {
    const double s = NaiveSigmoid(x[i]);
    ref_y[i] = static_cast<float>(s);
    ref_dx[i] = static_cast<float>(dy[i] * s * (1 - s));
  }
  EXPECT_TRUE(AllClose(y, ref_y, 1e-7f, 1e-6f));
  EXPECT_TRUE(AllClose(dx, ref_dx, 1e-7f, 1e-5f));
}

// Central differences of L = sum w * f(x) against the backward pass.
TEST(ActivationCpuTest, BackwardMatchesFiniteDifferences) {
  CpuDevice cpu(0, 1);
  const int64_t n = 64;
  std::vector<float> x = RandomVector(n, 3, -3.f, 3.f);
  // Keep ReLU's inputs away from the kink at 0, where it has no derivative.
  for (float& v : x) {
    if (std::fabs(v) < 0.1f) v += v < 0 ? -0.1f : 0.1f;
  }
  const std::vector<float> w = RandomVector(n, 4);
  const float h = 1e-2f;

  using Forward = absl::Status (*)(Device&, int64_t, const float*, float*);
  using Backward = absl::Status (*)(Device&, int64_t, const float*, const float*, float*);
  const struct {
    const char* name;
    Forward forward;
    Backward backward;
  } cases[] = {{"relu", ReluForward, ReluBackward}, {"sigmoid", SigmoidForward, SigmoidBackward}};

  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    std::vector<float> y(n), dx(n), numeric(n);
    ASSERT_TRUE(c.forward(cpu, n, x.data(), y.data()).ok());
    ASSERT_TRUE(c.backward(cpu, n, y.data(), w.data(), dx.data()).ok());
    for (int64_t i = 0; i < n; ++i) {
      std::vector<float> xp = x, xm = x, yp(n), ym(n);
      xp[i] += h;
      xm[i] -= h;
      ASSERT_TRUE(c.forward(cpu, n, xp.data(), yp.data()).ok());
      ASSERT_TRUE(c.forward(cpu, n, xm.data(), ym.data()).ok());
      numeric[i] = static_cast<float>((WeightedSum(w, yp) - WeightedSum(w, ym)) / (2 * h));
    }
    EXPECT_TRUE(AllClose(dx, numeric, 1e-4f, 1e-3f));
  }
}

TEST(ActivationCpuTest, RejectsNegativeCount) {
  CpuDevice cpu(0, 1);
  float v = 0;
  const absl::Status s = ReluForward(cpu, -1, &v, &v);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("n ="), absl::string_view::npos) << s;
  EXPECT_EQ(SigmoidBackward(cpu, -5, &v, &v, &v).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ReluForward(cpu, 0, nullptr, nullptr).ok());
}

TEST(ActivationCudaTest, MatchesCpu) {
  PS_SKIP_WITHOUT_GPU();
  Device* gpu = testing::TestGpu();
  CpuDevice cpu(0, 2);
  const int64_t n = 1'000'003;  // not a multiple of the block size
  std::vector<float> x = RandomVector(n, 11, -30.f, 30.f), dy = RandomVector(n, 12);
  x[0] = 1e4f;
  x[1] = -1e4f;
  x[2] = 0.f;
  std::vector<float> y(n), dx(n);
  DeviceBuffer gx(gpu, x), gy(gpu, n), gdy(gpu, dy), gdx(gpu, n);

  ASSERT_TRUE(ReluForward(cpu, n, x.data(), y.data()).ok());
  ASSERT_TRUE(ReluForward(*gpu, n, gx.data(), gy.data()).ok());
  EXPECT_TRUE(AllClose(gy.ToHost(), y, 0, 0));
  ASSERT_TRUE(ReluBackward(cpu, n, y.data(), dy.data(), dx.data()).ok());
  ASSERT_TRUE(ReluBackward(*gpu, n, gy.data(), gdy.data(), gdx.data()).ok());
  EXPECT_TRUE(AllClose(gdx.ToHost(), dx, 0, 0));

  ASSERT_TRUE(SigmoidForward(cpu, n, x.data(), y.data()).ok());
  ASSERT_TRUE(SigmoidForward(*gpu, n, gx.data(), gy.data()).ok());
  const std::vector<float> gpu_y = gy.ToHost();
  EXPECT_TRUE(AllClose(gpu_y, y, 1e-7f, 1e-6f));
  for (float v : gpu_y) ASSERT_TRUE(std::isfinite(v));
  ASSERT_TRUE(SigmoidBackward(cpu, n, y.data(), dy.data(), dx.data()).ok());
  ASSERT_TRUE(SigmoidBackward(*gpu, n, gy.data(), gdy.data(), gdx.data()).ok());
  EXPECT_TRUE(AllClose(gdx.ToHost(), dx, 1e-7f, 1e-5f));

  // In place on the GPU too.
  ASSERT_TRUE(ReluForward(*gpu, n, gx.data(), gx.data()).ok());
  ASSERT_TRUE(ReluForward(cpu, n, x.data(), x.data()).ok());
  EXPECT_TRUE(AllClose(gx.ToHost(), x, 0, 0));
}

}  // namespace
}  // namespace ps::kernels
