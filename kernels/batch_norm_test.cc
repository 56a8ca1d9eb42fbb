#include "kernels/batch_norm.h"

#include <cmath>
#include <vector>

#include "common/cpu_device.h"
#include "kernels/test_util.h"

namespace ps::kernels {
namespace {

using testing::AllClose;
using testing::DeviceBuffer;
using testing::RandomVector;

BatchNormShape MakeShape(int64_t n, int64_t c, int64_t s) {
  BatchNormShape shape;
  shape.batch = n;
  shape.channels = c;
  shape.spatial = s;
  return shape;
}

int64_t Size(const BatchNormShape& s) { return s.batch * s.channels * s.spatial; }
int64_t Index(const BatchNormShape& s, int64_t n, int64_t c, int64_t i) {
  return (n * s.channels + c) * s.spatial + i;
}

// Everything the training forward produces, computed from the definitions in
// double (one pass per quantity, no shared code with the kernels).
struct NaiveForward {
  std::vector<float> y, mean, inv_std, running_mean, running_var;
};

NaiveForward NaiveTraining(const BatchNormShape& s, float eps, float momentum,
                           const std::vector<float>& x, const std::vector<float>& gamma,
                           const std::vector<float>& beta, std::vector<float> running_mean,
                           std::vector<float> running_var) {
  NaiveForward out;
  out.y.resize(Size(s));
  const int64_t m = s.batch * s.spatial;
  for (int64_t c = 0; c < s.channels; ++c) {
    double sum = 0, sq = 0;
    for (int64_t n = 0; n < s.batch; ++n) {
      for (int64_t i = 0; i < s.spatial; ++i) sum += x[Index(s, n, c, i)];
    }
    const double mean = sum / m;
    for (int64_t n = 0; n < s.batch; ++n) {
      for (int64_t i = 0; i < s.spatial; ++i) {
        sq += (x[Index(s, n, c, i)] - mean) * (x[Index(s, n, c, i)] - mean);
      }
    }
    const double var = sq / m, unbiased = sq / (m - 1);
    for (int64_t n = 0; n < s.batch; ++n) {
      for (int64_t i = 0; i < s.spatial; ++i) {
        const int64_t k = Index(s, n, c, i);
        out.y[k] = static_cast<float>(gamma[c] * (x[k] - mean) / std::sqrt(var + eps) + beta[c]);
      }
    }
    out.mean.push_back(static_cast<float>(mean));
    out.inv_std.push_back(static_cast<float>(1 / std::sqrt(var + eps)));
    running_mean[c] =
        static_cast<float>((1 - double(momentum)) * running_mean[c] + momentum * mean);
    running_var[c] =
        static_cast<float>((1 - double(momentum)) * running_var[c] + momentum * unbiased);
  }
  out.running_mean = running_mean;
  out.running_var = running_var;
  return out;
}

struct NaiveGrads {
  std::vector<float> dx, dgamma, dbeta;
};

// The textbook backward in double, from x and dy alone (statistics recomputed).
NaiveGrads NaiveBackward(const BatchNormShape& s, float eps, const std::vector<float>& x,
                         const std::vector<float>& gamma, const std::vector<float>& dy) {
  NaiveGrads g;
  g.dx.resize(Size(s));
  const int64_t m = s.batch * s.spatial;
  for (int64_t c = 0; c < s.channels; ++c) {
    double sum = 0, sq = 0;
    for (int64_t n = 0; n < s.batch; ++n) {
      for (int64_t i = 0; i < s.spatial; ++i) sum += x[Index(s, n, c, i)];
    }
    const double mean = sum / m;
    for (int64_t n = 0; n < s.batch; ++n) {
      for (int64_t i = 0; i < s.spatial; ++i) {
        sq += (x[Index(s, n, c, i)] - mean) * (x[Index(s, n, c, i)] - mean);
      }
    }
    const double inv_std = 1 / std::sqrt(sq / m + eps);
    double dbeta = 0, dgamma = 0;
    for (int64_t n = 0; n < s.batch; ++n) {
      for (int64_t i = 0; i < s.spatial; ++i) {
        const int64_t k = Index(s, n, c, i);
        dbeta += dy[k];
        dgamma += dy[k] * (x[k] - mean) * inv_std;
      }
    }
    for (int64_t n = 0; n < s.batch; ++n) {
      for (int64_t i = 0; i < s.spatial; ++i) {
        const int64_t k = Index(s, n, c, i);
        const double xhat = (x[k] - mean) * inv_std;
        g.dx[k] = static_cast<float>(gamma[c] * inv_std / m * (m * dy[k] - dbeta - xhat * dgamma));
      }
    }
    g.dgamma.push_back(static_cast<float>(dgamma));
    g.dbeta.push_back(static_cast<float>(dbeta));
  }
  return g;
}

TEST(BatchNormCpuTest, HandComputedAndRunningStatsAfterTwoSteps) {
  CpuDevice cpu(0, 1);
  // One channel, N = 2, S = 2: values {1, 2, 3, 4}.
  const BatchNormShape s = MakeShape(2, 1, 2);
  std::vector<float> x = {1, 2, 3, 4}, gamma = {2}, beta = {1}, y(4);
  std::vector<float> mean(1), inv_std(1), rm = {0}, rv = {1};
  ASSERT_TRUE(BatchNormForwardTraining(cpu, s, 0.f, 0.1f, x.data(), gamma.data(), beta.data(),
                                       y.data(), mean.data(), inv_std.data(), rm.data(), rv.data())
                  .ok());
  // mean 2.5, biased var 1.25, unbiased 5/3.
  const float k = 2.f / std::sqrt(1.25f);
  EXPECT_TRUE(
      AllClose(y, {-1.5f * k + 1, -0.5f * k + 1, 0.5f * k + 1, 1.5f * k + 1}, 1e-6f, 1e-6f));
  EXPECT_TRUE(AllClose(mean, {2.5f}, 0, 1e-7f));
  EXPECT_TRUE(AllClose(inv_std, {1 / std::sqrt(1.25f)}, 0, 1e-6f));
  // rm = 0.9 * 0 + 0.1 * 2.5; rv = 0.9 * 1 + 0.1 * 5/3.
  EXPECT_TRUE(AllClose(rm, {0.25f}, 1e-7f, 1e-6f));
  EXPECT_TRUE(AllClose(rv, {0.9f + 1.f / 6}, 1e-7f, 1e-6f));

  // Step 2 with {2, 4, 6, 8}: mean 5, unbiased var 20/3.
  x = {2, 4, 6, 8};
  ASSERT_TRUE(BatchNormForwardTraining(cpu, s, 0.f, 0.1f, x.data(), gamma.data(), beta.data(),
                                       y.data(), mean.data(), inv_std.data(), rm.data(), rv.data())
                  .ok());
  EXPECT_TRUE(AllClose(rm, {0.9f * 0.25f + 0.5f}, 1e-7f, 1e-6f));
  EXPECT_TRUE(AllClose(rv, {0.9f * (0.9f + 1.f / 6) + 2.f / 3}, 1e-7f, 1e-6f));

  // Inference with those running stats.
  ASSERT_TRUE(BatchNormForwardInference(cpu, s, 0.f, x.data(), gamma.data(), beta.data(), rm.data(),
                                        rv.data(), y.data())
                  .ok());
  std::vector<float> expected(4);
  for (int i = 0; i < 4; ++i) expected[i] = 2 * (x[i] - rm[0]) / std::sqrt(rv[0]) + 1;
  EXPECT_TRUE(AllClose(y, expected, 1e-6f, 1e-6f));
}

std::vector<BatchNormShape> TestShapes() {
  return {MakeShape(4, 3, 5), MakeShape(16, 8, 1), MakeShape(2, 1, 64), MakeShape(1, 4, 9),
          MakeShape(8, 32, 256)};  // the last spans several ParallelFor chunks
}

TEST(BatchNormCpuTest, MatchesNaiveReferenceOverTwoSteps) {
  CpuDevice cpu(0, 2);
  const float eps = 1e-5f, momentum = 0.1f;
  for (const BatchNormShape& s : TestShapes()) {
    SCOPED_TRACE(::testing::Message() << "N" << s.batch << " C" << s.channels << " S" << s.spatial);
    const int64_t c = s.channels;
    const std::vector<float> gamma = RandomVector(c, 1, 0.5f, 1.5f), beta = RandomVector(c, 2);
    std::vector<float> rm = RandomVector(c, 3), rv = RandomVector(c, 4, 0.5f, 2.f);
    std::vector<float> y(Size(s)), mean(c), inv_std(c);
    for (int step = 0; step < 2; ++step) {
      const std::vector<float> x = RandomVector(Size(s), 10 + step, -2.f, 3.f);
      const NaiveForward ref = NaiveTraining(s, eps, momentum, x, gamma, beta, rm, rv);
      ASSERT_TRUE(BatchNormForwardTraining(cpu, s, eps, momentum, x.data(), gamma.data(),
                                           beta.data(), y.data(), mean.data(), inv_std.data(),
                                           rm.data(), rv.data())
                      .ok());
      EXPECT_TRUE(AllClose(y, ref.y, 1e-5f, 1e-5f));
      EXPECT_TRUE(AllClose(mean, ref.mean, 1e-7f, 1e-6f));
      EXPECT_TRUE(AllClose(inv_std, ref.inv_std, 0, 1e-6f));
      EXPECT_TRUE(AllClose(rm, ref.running_mean, 1e-7f, 1e-6f));
      EXPECT_TRUE(AllClose(rv, ref.running_var, 1e-7f, 1e-6f));

      const std::vector<float> dy = RandomVector(Size(s), 20 + step);
      std::vector<float> dx(Size(s)), dgamma(c), dbeta(c);
      ASSERT_TRUE(BatchNormBackward(cpu, s, x.data(), gamma.data(), mean.data(), inv_std.data(),
                                    dy.data(), dx.data(), dgamma.data(), dbeta.data())
                      .ok());
      const NaiveGrads grads = NaiveBackward(s, eps, x, gamma, dy);
      EXPECT_TRUE(AllClose(dx, grads.dx, 1e-5f, 1e-4f));
      EXPECT_TRUE(AllClose(dgamma, grads.dgamma, 1e-5f, 1e-5f));
      EXPECT_TRUE(AllClose(dbeta, grads.dbeta, 1e-5f, 1e-5f));
    }
  }
}

// A large offset relative to the spread: a one-pass E[x^2] - E[x]^2 variance
// in float would lose every significant digit here.
TEST(BatchNormCpuTest, VarianceStableUnderLargeOffset) {
  CpuDevice cpu(0, 1);
  const BatchNormShape s = MakeShape(8, 2, 16);
  std::vector<float> x = RandomVector(Size(s), 5, -1.f, 1.f);
  for (float& v : x) v += 1000.f;
  const std::vector<float> gamma = {1, 1}, beta = {0, 0};
  std::vector<float> rm = {0, 0}, rv = {1, 1}, y(Size(s)), mean(2), inv_std(2);
  ASSERT_TRUE(BatchNormForwardTraining(cpu, s, 1e-5f, 0.1f, x.data(), gamma.data(), beta.data(),
                                       y.data(), mean.data(), inv_std.data(), rm.data(), rv.data())
                  .ok());
  const NaiveForward ref = NaiveTraining(s, 1e-5f, 0.1f, x, gamma, beta, {0, 0}, {1, 1});
  EXPECT_TRUE(AllClose(inv_std, ref.inv_std, 0, 1e-5f));
  EXPECT_TRUE(AllClose(rv, ref.running_var, 0, 1e-5f));
  // Output precision is bounded by x's own rounding near 1000 (~6e-5).
  EXPECT_TRUE(AllClose(y, ref.y, 2e-4f, 1e-4f));
}

// Central differences of L = sum w * y (training mode, batch statistics)
// against dx, dgamma and dbeta.
TEST(BatchNormCpuTest, BackwardMatchesFiniteDifferences) {
  CpuDevice cpu(0, 1);
  const float eps = 1e-5f;
  // Planes of 4 and 1 (the scalar tail of the channel sums) and of 12 (one
  // 8-wide vector step, then the tail).
  for (const BatchNormShape& s : {MakeShape(3, 2, 4), MakeShape(6, 3, 1), MakeShape(2, 2, 12)}) {
    SCOPED_TRACE(::testing::Message() << "N" << s.batch << " C" << s.channels << " S" << s.spatial);
    const int64_t c = s.channels, n = Size(s);
    const std::vector<float> x = RandomVector(n, 1), w = RandomVector(n, 2);
    const std::vector<float> gamma = RandomVector(c, 3, 0.5f, 1.5f), beta = RandomVector(c, 4);
    auto loss = [&](const std::vector<float>& in, const std::vector<float>& g,
                    const std::vector<float>& b) {
      std::vector<float> y(n), mean(c), inv_std(c), rm(c, 0.f), rv(c, 1.f);
      EXPECT_TRUE(BatchNormForwardTraining(cpu, s, eps, 0.1f, in.data(), g.data(), b.data(),
                                           y.data(), mean.data(), inv_std.data(), rm.data(),
                                           rv.data())
                      .ok());
      double sum = 0;
      for (int64_t i = 0; i < n; ++i) sum += double(w[i]) * y[i];
      return sum;
    };
    const float h = 3e-3f;
    // (L(v + h) - L(v - h)) / 2h, perturbing element i of *v in place.
    auto central = [&](std::vector<float>* v, int64_t i, const std::vector<float>* in,
                       const std::vector<float>* g, const std::vector<float>* b) {
      const float orig = (*v)[i];
      (*v)[i] = orig + h;
      const double plus = loss(*in, *g, *b);
      (*v)[i] = orig - h;
      const double minus = loss(*in, *g, *b);
      (*v)[i] = orig;
      return static_cast<float>((plus - minus) / (2 * h));
    };
    std::vector<float> xv = x, gv = gamma, bv = beta;
    std::vector<float> num_dx(n), num_dgamma(c), num_dbeta(c);
    for (int64_t i = 0; i < n; ++i) num_dx[i] = central(&xv, i, &xv, &gv, &bv);
    for (int64_t i = 0; i < c; ++i) {
      num_dgamma[i] = central(&gv, i, &xv, &gv, &bv);
      num_dbeta[i] = central(&bv, i, &xv, &gv, &bv);
    }

    std::vector<float> y(n), mean(c), inv_std(c), rm(c, 0.f), rv(c, 1.f);
    ASSERT_TRUE(BatchNormForwardTraining(cpu, s, eps, 0.1f, x.data(), gamma.data(), beta.data(),
                                         y.data(), mean.data(), inv_std.data(), rm.data(),
                                         rv.data())
                    .ok());
    std::vector<float> dx(n), dgamma(c), dbeta(c);
    ASSERT_TRUE(BatchNormBackward(cpu, s, x.data(), gamma.data(), mean.data(), inv_std.data(),
                                  w.data(), dx.data(), dgamma.data(), dbeta.data())
                    .ok());
    EXPECT_TRUE(AllClose(dx, num_dx, 5e-4f, 5e-3f));
    EXPECT_TRUE(AllClose(dgamma, num_dgamma, 5e-4f, 5e-3f));
    EXPECT_TRUE(AllClose(dbeta, num_dbeta, 5e-4f, 5e-3f));
  }
}

TEST(BatchNormCpuTest, ValidationNamesTheField) {
  CpuDevice cpu(0, 1);
  float v[4] = {};
  auto train = [&](const BatchNormShape& s, float eps, float momentum) {
    return BatchNormForwardTraining(cpu, s, eps, momentum, v, v, v, v, v, v, v, v);
  };
  auto expect_invalid = [](const absl::Status& st, const char* field) {
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_NE(st.message().find(field), absl::string_view::npos) << st;
  };
  expect_invalid(train(MakeShape(1, 1, 1), 1e-5f, 0.1f), "batch * spatial");
  expect_invalid(train(MakeShape(0, 1, 4), 1e-5f, 0.1f), "batch");
  expect_invalid(train(MakeShape(2, 0, 1), 1e-5f, 0.1f), "channels");
  expect_invalid(train(MakeShape(2, 1, 0), 1e-5f, 0.1f), "spatial");
  expect_invalid(train(MakeShape(2, 1, 1), -1.f, 0.1f), "eps");
  expect_invalid(train(MakeShape(2, 1, 1), 1e-5f, 1.5f), "momentum");
  expect_invalid(BatchNormForwardInference(cpu, MakeShape(1, -3, 1), 1e-5f, v, v, v, v, v, v),
                 "channels");
  expect_invalid(BatchNormBackward(cpu, MakeShape(1, 1, -1), v, v, v, v, v, v, v, v), "spatial");
  // Inference and backward accept a single value per channel.
  EXPECT_TRUE(BatchNormForwardInference(cpu, MakeShape(1, 1, 1), 1e-5f, v, v, v, v, v, v).ok());
}

TEST(BatchNormCudaTest, MatchesCpu) {
  PS_SKIP_WITHOUT_GPU();
  Device* gpu = testing::TestGpu();
  CpuDevice cpu(0, 2);
  const float eps = 1e-5f, momentum = 0.1f;
  std::vector<BatchNormShape> shapes = TestShapes();
  shapes.push_back(MakeShape(32, 64, 32 * 32));  // more values per channel than threads
  shapes.push_back(MakeShape(128, 10, 1));       // BatchNorm1d
  shapes.push_back(MakeShape(2, 512, 49));       // more channels than SMs
  for (const BatchNormShape& s : shapes) {
    SCOPED_TRACE(::testing::Message() << "N" << s.batch << " C" << s.channels << " S" << s.spatial);
    const int64_t c = s.channels, n = Size(s);
    const std::vector<float> gamma = RandomVector(c, 1, 0.5f, 1.5f), beta = RandomVector(c, 2);
    std::vector<float> rm = RandomVector(c, 3), rv = RandomVector(c, 4, 0.5f, 2.f);
    std::vector<float> y(n), mean(c), inv_std(c), dx(n), dgamma(c), dbeta(c);
    DeviceBuffer g_gamma(gpu, gamma), g_beta(gpu, beta), g_rm(gpu, rm), g_rv(gpu, rv);
    DeviceBuffer g_x(gpu, n), g_y(gpu, n), g_mean(gpu, c), g_inv_std(gpu, c);
    DeviceBuffer g_dy(gpu, n), g_dx(gpu, n), g_dgamma(gpu, c), g_dbeta(gpu, c);
    for (int step = 0; step < 2; ++step) {
      const std::vector<float> x = RandomVector(n, 10 + step, -2.f, 3.f);
      const std::vector<float> dy = RandomVector(n, 20 + step);
      ASSERT_TRUE(gpu->CopyHostToDevice(g_x.data(), x.data(), n * sizeof(float)).ok());
      ASSERT_TRUE(gpu->CopyHostToDevice(g_dy.data(), dy.data(), n * sizeof(float)).ok());

      ASSERT_TRUE(BatchNormForwardTraining(cpu, s, eps, momentum, x.data(), gamma.data(),
                                           beta.data(), y.data(), mean.data(), inv_std.data(),
                                           rm.data(), rv.data())
                      .ok());
      ASSERT_TRUE(BatchNormForwardTraining(*gpu, s, eps, momentum, g_x.data(), g_gamma.data(),
                                           g_beta.data(), g_y.data(), g_mean.data(),
                                           g_inv_std.data(), g_rm.data(), g_rv.data())
                      .ok());
      EXPECT_TRUE(AllClose(g_y.ToHost(), y, 1e-5f, 1e-5f));
      EXPECT_TRUE(AllClose(g_mean.ToHost(), mean, 1e-7f, 1e-6f));
      EXPECT_TRUE(AllClose(g_inv_std.ToHost(), inv_std, 0, 1e-6f));
      EXPECT_TRUE(AllClose(g_rm.ToHost(), rm, 1e-7f, 1e-6f));
      EXPECT_TRUE(AllClose(g_rv.ToHost(), rv, 1e-7f, 1e-6f));

      ASSERT_TRUE(BatchNormBackward(cpu, s, x.data(), gamma.data(), mean.data(), inv_std.data(),
                                    dy.data(), dx.data(), dgamma.data(), dbeta.data())
                      .ok());
      ASSERT_TRUE(BatchNormBackward(*gpu, s, g_x.data(), g_gamma.data(), g_mean.data(),
                                    g_inv_std.data(), g_dy.data(), g_dx.data(), g_dgamma.data(),
                                    g_dbeta.data())
                      .ok());
      EXPECT_TRUE(AllClose(g_dx.ToHost(), dx, 1e-5f, 1e-4f));
      EXPECT_TRUE(AllClose(g_dgamma.ToHost(), dgamma, 1e-5f, 1e-5f));
      EXPECT_TRUE(AllClose(g_dbeta.ToHost(), dbeta, 1e-5f, 1e-5f));
    }
    // Reproducible: the same step twice gives bit-identical statistics.
    std::vector<float> first = g_dgamma.ToHost();
    ASSERT_TRUE(BatchNormBackward(*gpu, s, g_x.data(), g_gamma.data(), g_mean.data(),
                                  g_inv_std.data(), g_dy.data(), g_dx.data(), g_dgamma.data(),
                                  g_dbeta.data())
                    .ok());
    EXPECT_TRUE(AllClose(g_dgamma.ToHost(), first, 0, 0));

    const std::vector<float> x = RandomVector(n, 30, -2.f, 3.f);
    ASSERT_TRUE(gpu->CopyHostToDevice(g_x.data(), x.data(), n * sizeof(float)).ok());
    ASSERT_TRUE(BatchNormForwardInference(cpu, s, eps, x.data(), gamma.data(), beta.data(),
                                          rm.data(), rv.data(), y.data())
                    .ok());
    ASSERT_TRUE(BatchNormForwardInference(*gpu, s, eps, g_x.data(), g_gamma.data(), g_beta.data(),
                                          g_rm.data(), g_rv.data(), g_y.data())
                    .ok());
    EXPECT_TRUE(AllClose(g_y.ToHost(), y, 1e-5f, 1e-5f));
  }
}

}  // namespace
}  // namespace ps::kernels
