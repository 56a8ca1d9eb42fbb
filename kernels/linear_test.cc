#include "kernels/linear.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/cpu_device.h"
#include "kernels/gemm.h"
#include "kernels/test_util.h"

namespace ps::kernels {
namespace {

using testing::AllClose;
using testing::DeviceBuffer;
using testing::NumericGradient;
using testing::RandomVector;

struct LinearCase {
  int64_t batch, in, out;
};

// Batch 1, odd sizes, LeNet's three layers at batch 256.
const LinearCase kCases[] = {{1, 1, 1},       {1, 7, 3},      {5, 4, 6},    {33, 17, 65},
                             {256, 400, 120}, {256, 120, 84}, {256, 84, 10}};

// y = x weight^T + bias, in double.
std::vector<float> ReferenceForward(const LinearCase& cs, const std::vector<float>& x,
                                    const std::vector<float>& w, const float* bias) {
  std::vector<float> y(cs.batch * cs.out);
  for (int64_t n = 0; n < cs.batch; ++n) {
    for (int64_t o = 0; o < cs.out; ++o) {
      double sum = bias != nullptr ? bias[o] : 0.0;
      for (int64_t i = 0; i < cs.in; ++i) sum += double(x[n * cs.in + i]) * w[o * cs.in + i];
      y[n * cs.out + o] = static_cast<float>(sum);
    }
  }
  return y;
}

struct Grads {
  std::vector<float> dx, dw, db;
};

Grads ReferenceBackward(const LinearCase& cs, const std::vector<float>& x,
                        const std::vector<float>& w, const std::vector<float>& dy) {
  std::vector<double> dx(cs.batch * cs.in), dw(cs.out * cs.in), db(cs.out);
  for (int64_t n = 0; n < cs.batch; ++n) {
    for (int64_t o = 0; o < cs.out; ++o) {
      const double g = dy[n * cs.out + o];
      db[o] += g;
      for (int64_t i = 0; i < cs.in; ++i) {
        dx[n * cs.in + i] += g * w[o * cs.in + i];
        dw[o * cs.in + i] += g * x[n * cs.in + i];
      }
    }
  }
  return {std::vector<float>(dx.begin(), dx.end()), std::vector<float>(dw.begin(), dw.end()),
          std::vector<float>(db.begin(), db.end())};
}

// Device threads and BLAS threads: one core; device threads each running a
// slice on a single-threaded BLAS; BLAS threading every GEMM.
const struct { int threads, blas_threads; } kThreadConfigs[] = {{1, 1}, {2, 1}, {2, 2}};

// Runs `check` for every case on a device of each thread configuration,
// with a fresh seed per random input (from `first_seed` in each
// configuration, so every configuration sees the same inputs).
template <typename Check>
void ForEveryConfigAndCase(uint64_t first_seed, const Check& check) {
  for (const auto& config : kThreadConfigs) {
    const ScopedBlasThreads blas(config.blas_threads);
    CpuDevice cpu(0, config.threads);
    uint64_t seed = first_seed;
    for (const LinearCase& cs : kCases) {
      SCOPED_TRACE(::testing::Message()
                   << "batch=" << cs.batch << " in=" << cs.in << " out=" << cs.out
                   << " threads=" << config.threads << " blas_threads=" << config.blas_threads);
      check(cpu, cs, seed);
    }
  }
}

TEST(LinearCpuTest, ForwardMatchesReference) {
  ForEveryConfigAndCase(1, [](CpuDevice& cpu, const LinearCase& cs, uint64_t& seed) {
    const auto x = RandomVector(cs.batch * cs.in, seed++);
    const auto w = RandomVector(cs.out * cs.in, seed++);
    const auto b = RandomVector(cs.out, seed++);
    std::vector<float> y(cs.batch * cs.out, -7.f);
    ASSERT_TRUE(
        LinearForward(cpu, cs.batch, cs.in, cs.out, x.data(), w.data(), b.data(), y.data()).ok());
    EXPECT_TRUE(AllClose(y, ReferenceForward(cs, x, w, b.data()), 1e-4f, 1e-4f));
    ASSERT_TRUE(
        LinearForward(cpu, cs.batch, cs.in, cs.out, x.data(), w.data(), nullptr, y.data()).ok());
    EXPECT_TRUE(AllClose(y, ReferenceForward(cs, x, w, nullptr), 1e-4f, 1e-4f));
  });
}

TEST(LinearCpuTest, BackwardMatchesReference) {
  ForEveryConfigAndCase(10, [](CpuDevice& cpu, const LinearCase& cs, uint64_t& seed) {
    const auto x = RandomVector(cs.batch * cs.in, seed++);
    const auto w = RandomVector(cs.out * cs.in, seed++);
    const auto dy = RandomVector(cs.batch * cs.out, seed++);
    const Grads ref = ReferenceBackward(cs, x, w, dy);
    // Outputs start as garbage: they must be overwritten, not accumulated.
    std::vector<float> dx(x.size(), 9.f), dw(w.size(), 9.f), db(cs.out, 9.f);
    ASSERT_TRUE(LinearBackward(cpu, cs.batch, cs.in, cs.out, x.data(), w.data(), dy.data(),
                               dx.data(), dw.data(), db.data())
                    .ok());
    EXPECT_TRUE(AllClose(dx, ref.dx, 1e-4f, 1e-4f));
    EXPECT_TRUE(AllClose(dw, ref.dw, 1e-4f, 1e-4f));
    EXPECT_TRUE(AllClose(db, ref.db, 1e-4f, 1e-4f));
    // dx and dbias may be skipped.
    std::fill(dw.begin(), dw.end(), 9.f);
    ASSERT_TRUE(LinearBackward(cpu, cs.batch, cs.in, cs.out, x.data(), w.data(), dy.data(),
                               nullptr, dw.data(), nullptr)
                    .ok());
    EXPECT_TRUE(AllClose(dw, ref.dw, 1e-4f, 1e-4f));
  });
}

// Central differences of L = sum(y * g), which is linear in each parameter,
// so the only error is rounding.
TEST(LinearCpuTest, BackwardMatchesNumericGradient) {
  CpuDevice cpu(0, 1);
  const LinearCase cs = {3, 4, 5};
  auto x = RandomVector(cs.batch * cs.in, 1);
  auto w = RandomVector(cs.out * cs.in, 2);
  auto b = RandomVector(cs.out, 3);
  const auto g = RandomVector(cs.batch * cs.out, 4);
  auto loss = [&]() {
    std::vector<float> y(cs.batch * cs.out);
    EXPECT_TRUE(
        LinearForward(cpu, cs.batch, cs.in, cs.out, x.data(), w.data(), b.data(), y.data()).ok());
    double l = 0;
    for (size_t i = 0; i < y.size(); ++i) l += double(y[i]) * g[i];
    return l;
  };
  std::vector<float> dx(x.size()), dw(w.size()), db(b.size());
  ASSERT_TRUE(LinearBackward(cpu, cs.batch, cs.in, cs.out, x.data(), w.data(), g.data(), dx.data(),
                             dw.data(), db.data())
                  .ok());
  EXPECT_TRUE(AllClose(dx, NumericGradient(&x, 1e-2f, loss), 1e-3f, 1e-3f));
  EXPECT_TRUE(AllClose(dw, NumericGradient(&w, 1e-2f, loss), 1e-3f, 1e-3f));
  EXPECT_TRUE(AllClose(db, NumericGradient(&b, 1e-2f, loss), 1e-3f, 1e-3f));
}

TEST(LinearCpuTest, EmptyBatchGivesZeroGradients) {
  CpuDevice cpu(0, 1);
  const auto w = RandomVector(3 * 2, 1);
  std::vector<float> dw(6, 5.f), db(3, 5.f);
  ASSERT_TRUE(
      LinearBackward(cpu, 0, 2, 3, nullptr, w.data(), nullptr, nullptr, dw.data(), db.data()).ok());
  EXPECT_TRUE(AllClose(dw, std::vector<float>(6, 0.f), 0, 0));
  EXPECT_TRUE(AllClose(db, std::vector<float>(3, 0.f), 0, 0));
  EXPECT_TRUE(LinearForward(cpu, 0, 2, 3, nullptr, w.data(), nullptr, nullptr).ok());
}

TEST(LinearCpuTest, RejectsBadSizes) {
  CpuDevice cpu(0, 1);
  std::vector<float> buf(64);
  float* p = buf.data();
  const absl::Status negative = LinearForward(cpu, 2, -1, 3, p, p, p, p);
  EXPECT_EQ(negative.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(negative.message().find("in_features"), absl::string_view::npos) << negative;
  EXPECT_EQ(LinearForward(cpu, -2, 1, 3, p, p, p, p).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LinearBackward(cpu, 2, 2, -3, p, p, p, p, p, p).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LinearBackward(cpu, 2, 2, int64_t{1} << 31, p, p, p, p, p, p).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LinearForward(cpu, 2, 2, 2, nullptr, p, p, p).code(),
            absl::StatusCode::kInvalidArgument);
  // Null inputs a wanted output needs: x for dweight, weight for dx.
  EXPECT_EQ(LinearBackward(cpu, 2, 2, 2, nullptr, p, p, nullptr, p, p).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LinearBackward(cpu, 2, 2, 2, p, nullptr, p, p, nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

// The parameter gradients in one call and dx in another (what a layer does
// to hand its gradients over before computing dx) give the bits of one call.
// The row-block forms over every block (of uneven size) make the whole
// layer's forward and weight gradient; ranges outside the layer are refused.
TEST(LinearCpuTest, RowBlocksMakeTheWholeLayer) {
  CpuDevice device(0, 1);
  constexpr int64_t kBatch = 5, kIn = 7, kOut = 70;
  const std::vector<float> x = RandomVector(kBatch * kIn, 1), w = RandomVector(kOut * kIn, 2),
                           b = RandomVector(kOut, 3), dy = RandomVector(kBatch * kOut, 4);
  std::vector<float> y(kBatch * kOut), y_blocks(kBatch * kOut, NAN);
  std::vector<float> dw(kOut * kIn), dw_blocks(kOut * kIn, NAN);
  ASSERT_TRUE(
      LinearForward(device, kBatch, kIn, kOut, x.data(), w.data(), b.data(), y.data()).ok());
  ASSERT_TRUE(LinearBackward(device, kBatch, kIn, kOut, x.data(), w.data(), dy.data(), nullptr,
                             dw.data(), nullptr)
                  .ok());
  for (int64_t row = 0; row < kOut; row += 32) {
    const int64_t end = std::min(kOut, row + 32);
    ASSERT_TRUE(LinearForwardRows(device, kBatch, kIn, kOut, x.data(), w.data(), row, end,
                                  y_blocks.data())
                    .ok());
    ASSERT_TRUE(LinearWeightGradientRows(device, kBatch, kIn, kOut, x.data(), dy.data(), row, end,
                                         dw_blocks.data())
                    .ok());
  }
  ASSERT_TRUE(LinearAddBias(device, kBatch, kOut, b.data(), y_blocks.data()).ok());
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y_blocks[i], y[i], 1e-5f) << i;
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_NEAR(dw_blocks[i], dw[i], 1e-5f) << i;
  EXPECT_EQ(LinearForwardRows(device, kBatch, kIn, kOut, x.data(), w.data(), 60, 71,
                              y_blocks.data())
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LinearWeightGradientRows(device, kBatch, kIn, kOut, x.data(), dy.data(), 10, 5,
                                     dw_blocks.data())
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LinearCpuTest, ParameterGradientsThenDxEqualOneCall) {
  for (int threads : {1, 2}) {
    CpuDevice cpu(0, threads);
    const int64_t n = 37, in = 300, out = 129;
    uint64_t seed = 7;
    const std::vector<float> x = testing::RandomVector(n * in, seed++);
    const std::vector<float> w = testing::RandomVector(out * in, seed++);
    const std::vector<float> dy = testing::RandomVector(n * out, seed++);
    std::vector<float> dx1(n * in), dw1(out * in), db1(out);
    std::vector<float> dx2(n * in), dw2(out * in), db2(out);
    ASSERT_TRUE(LinearBackward(cpu, n, in, out, x.data(), w.data(), dy.data(), dx1.data(),
                               dw1.data(), db1.data()).ok());
    ASSERT_TRUE(LinearBackward(cpu, n, in, out, x.data(), w.data(), dy.data(), nullptr,
                               dw2.data(), db2.data()).ok());
    ASSERT_TRUE(LinearBackward(cpu, n, in, out, x.data(), w.data(), dy.data(), dx2.data(),
                               nullptr, nullptr).ok());
    EXPECT_EQ(dx1, dx2) << threads;
    EXPECT_EQ(dw1, dw2) << threads;
    EXPECT_EQ(db1, db2) << threads;
  }
}

TEST(LinearCudaTest, MatchesCpu) {
  PS_SKIP_WITHOUT_GPU();
  Device* gpu = testing::TestGpu();
  CpuDevice cpu(0, 1);
  uint64_t seed = 100;
  for (const LinearCase& cs : kCases) {
    SCOPED_TRACE(::testing::Message()
                 << "batch=" << cs.batch << " in=" << cs.in << " out=" << cs.out);
    const auto x = RandomVector(cs.batch * cs.in, seed++);
    const auto w = RandomVector(cs.out * cs.in, seed++);
    const auto b = RandomVector(cs.out, seed++);
    const auto dy = RandomVector(cs.batch * cs.out, seed++);
    DeviceBuffer gx(gpu, x), gw(gpu, w), gb(gpu, b), gdy(gpu, dy);
    DeviceBuffer gy(gpu, cs.batch * cs.out), gdx(gpu, x.size()), gdw(gpu, w.size()),
        gdb(gpu, b.size());

    std::vector<float> y(cs.batch * cs.out);
    ASSERT_TRUE(
        LinearForward(cpu, cs.batch, cs.in, cs.out, x.data(), w.data(), b.data(), y.data()).ok());
    ASSERT_TRUE(
        LinearForward(*gpu, cs.batch, cs.in, cs.out, gx.data(), gw.data(), gb.data(), gy.data())
            .ok());
    EXPECT_TRUE(AllClose(gy.ToHost(), y, 1e-4f, 1e-4f));
    ASSERT_TRUE(
        LinearForward(cpu, cs.batch, cs.in, cs.out, x.data(), w.data(), nullptr, y.data()).ok());
    ASSERT_TRUE(
        LinearForward(*gpu, cs.batch, cs.in, cs.out, gx.data(), gw.data(), nullptr, gy.data())
            .ok());
    EXPECT_TRUE(AllClose(gy.ToHost(), y, 1e-4f, 1e-4f));

    std::vector<float> dx(x.size()), dw(w.size()), db(b.size());
    ASSERT_TRUE(LinearBackward(cpu, cs.batch, cs.in, cs.out, x.data(), w.data(), dy.data(),
                               dx.data(), dw.data(), db.data())
                    .ok());
    ASSERT_TRUE(LinearBackward(*gpu, cs.batch, cs.in, cs.out, gx.data(), gw.data(), gdy.data(),
                               gdx.data(), gdw.data(), gdb.data())
                    .ok());
    EXPECT_TRUE(AllClose(gdx.ToHost(), dx, 1e-4f, 1e-4f));
    EXPECT_TRUE(AllClose(gdw.ToHost(), dw, 1e-4f, 1e-4f));
    EXPECT_TRUE(AllClose(gdb.ToHost(), db, 1e-4f, 1e-4f));
  }
}

}  // namespace
}  // namespace ps::kernels
