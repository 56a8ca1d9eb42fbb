#include "kernels/activation_pool.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "common/cpu_device.h"
#include "kernels/activation.h"
#include "kernels/pool.h"
#include "kernels/pool_test_util.h"
#include "kernels/test_util.h"

namespace ps::kernels {
namespace {

using testing::AllClose;
using testing::DeviceBuffer;
using testing::RandomVector;

using testing::InSize;
using testing::MakePoolShape;
using testing::OutSize;

const char* Name(PoolActivation act) { return act == PoolActivation::kRelu ? "relu" : "sigmoid"; }

// LeNet's two pools, the non-overlapping fast path with a floor remainder,
// ResNet's 3x3/2 pad 1, overlapping 3x3/1 pad 1 and a rectangular window.
std::vector<Pool2dShape> TestShapes() {
  std::vector<Pool2dShape> shapes = {
      MakePoolShape(3, 6, 28, 28, 2, 2, 0), MakePoolShape(2, 16, 10, 10, 2, 2, 0),
      MakePoolShape(3, 2, 7, 5, 2, 2, 0),   MakePoolShape(2, 3, 9, 7, 3, 2, 1),
      MakePoolShape(1, 2, 6, 5, 3, 1, 1),   MakePoolShape(1, 1, 1, 1, 1, 1, 0),
  };
  shapes.push_back(testing::RectangularPoolShape());
  return shapes;
}

// The unfused composition: activation.h's kernel, then pool.h's, and back.
struct Unfused {
  std::vector<float> a, y, dx;
  std::vector<int32_t> argmax;
};

Unfused RunUnfused(CpuDevice& cpu, PoolActivation act, bool max, const Pool2dShape& s,
                   const std::vector<float>& x, const std::vector<float>& dy) {
  const int64_t n_in = InSize(s);
  std::vector<float> a(n_in), da(n_in);
  Unfused out{{},
              std::vector<float>(OutSize(s)),
              std::vector<float>(n_in),
              std::vector<int32_t>(OutSize(s))};
  EXPECT_TRUE((act == PoolActivation::kRelu ? ReluForward(cpu, n_in, x.data(), a.data())
                                            : SigmoidForward(cpu, n_in, x.data(), a.data()))
                  .ok());
  if (max) {
    EXPECT_TRUE(MaxPool2dForward(cpu, s, a.data(), out.y.data(), out.argmax.data()).ok());
    EXPECT_TRUE(MaxPool2dBackward(cpu, s, dy.data(), out.argmax.data(), da.data()).ok());
  } else {
    EXPECT_TRUE(AvgPool2dForward(cpu, s, a.data(), out.y.data()).ok());
    EXPECT_TRUE(AvgPool2dBackward(cpu, s, dy.data(), da.data()).ok());
  }
  EXPECT_TRUE((act == PoolActivation::kRelu
                   ? ReluBackward(cpu, n_in, a.data(), da.data(), out.dx.data())
                   : SigmoidBackward(cpu, n_in, a.data(), da.data(), out.dx.data()))
                  .ok());
  out.a = a;
  return out;
}

// Straight from the definitions, in double: act, then every cell of the
// padded window, then the chain rule by scattering.
struct Naive {
  std::vector<float> y, dx;
};

Naive RunNaive(PoolActivation act, bool max, const Pool2dShape& s, const std::vector<float>& x,
               const std::vector<float>& dy) {
  auto f = [&](double v) {
    return act == PoolActivation::kRelu ? std::max(v, 0.0) : 1 / (1 + std::exp(-v));
  };
  auto df = [&](double v) {
    if (act == PoolActivation::kRelu) return v > 0 ? 1.0 : 0.0;
    const double y = 1 / (1 + std::exp(-v));
    return y * (1 - y);
  };
  std::vector<double> dx(InSize(s), 0.0);
  Naive out;
  const int64_t oh_n = s.out_height(), ow_n = s.out_width();
  for (int64_t plane = 0; plane < s.batch * s.channels; ++plane) {
    for (int64_t oh = 0; oh < oh_n; ++oh) {
      for (int64_t ow = 0; ow < ow_n; ++ow) {
        const double g = dy[(plane * oh_n + oh) * ow_n + ow];
        double sum = 0, best = -std::numeric_limits<double>::infinity();
        int64_t best_i = -1;
        std::vector<int64_t> cells;
        for (int64_t kh = 0; kh < s.kernel_h; ++kh) {
          for (int64_t kw = 0; kw < s.kernel_w; ++kw) {
            const int64_t h = oh * s.stride_h - s.pad_h + kh;
            const int64_t w = ow * s.stride_w - s.pad_w + kw;
            if (h < 0 || h >= s.height || w < 0 || w >= s.width) continue;
            const int64_t i = (plane * s.height + h) * s.width + w;
            const double v = f(x[i]);
            sum += v;
            cells.push_back(i);
            if (best_i < 0 || v > best) {
              best = v;
              best_i = i;
            }
          }
        }
        const double count = static_cast<double>(s.kernel_h * s.kernel_w);
        out.y.push_back(static_cast<float>(max ? best : sum / count));
        if (max) {
          dx[best_i] += g * df(x[best_i]);
        } else {
          for (int64_t i : cells) dx[i] += g / count * df(x[i]);
        }
      }
    }
  }
  out.dx.assign(dx.begin(), dx.end());
  return out;
}

// Distinct values spaced `gap` apart, shuffled: no max-pooling ties, and for
// ReLU no input within gap / 2 of the kink (the grid is offset by gap / 2).
std::vector<float> DistinctValues(int64_t n, float gap, uint64_t seed) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = (i - n / 2) * gap + gap / 2;
  std::shuffle(v.begin(), v.end(), std::mt19937_64(seed));
  return v;
}

TEST(ActivationPoolCpuTest, BitIdenticalToUnfusedKernels) {
  CpuDevice cpu(0, 2);
  for (const Pool2dShape& s : TestShapes()) {
    for (PoolActivation act : {PoolActivation::kRelu, PoolActivation::kSigmoid}) {
      for (bool max : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << Name(act) << (max ? " max" : " avg") << " N" << s.batch << " C"
                     << s.channels << " " << s.height << "x" << s.width << " k" << s.kernel_h << "x"
                     << s.kernel_w << " s" << s.stride_h << " p" << s.pad_h);
        // Wide inputs reach sigmoid's saturated tails.
        const std::vector<float> x = RandomVector(InSize(s), 11, -12.f, 12.f);
        const std::vector<float> dy = RandomVector(OutSize(s), 12);
        const Unfused ref = RunUnfused(cpu, act, max, s, x, dy);
        std::vector<float> a(InSize(s)), y(OutSize(s)), dx(InSize(s), -7.f);
        std::vector<int32_t> argmax(OutSize(s));
        if (max) {
          ASSERT_TRUE(
              ActivationMaxPool2dForward(cpu, act, s, x.data(), a.data(), y.data(), argmax.data())
                  .ok());
          EXPECT_EQ(argmax, ref.argmax);
          ASSERT_TRUE(ActivationMaxPool2dBackward(cpu, act, s, a.data(), dy.data(), argmax.data(),
                                                  dx.data())
                          .ok());
        } else {
          ASSERT_TRUE(ActivationAvgPool2dForward(cpu, act, s, x.data(), a.data(), y.data()).ok());
          ASSERT_TRUE(
              ActivationAvgPool2dBackward(cpu, act, s, a.data(), dy.data(), dx.data()).ok());
        }
        EXPECT_TRUE(AllClose(a, ref.a, 0, 0));
        EXPECT_TRUE(AllClose(y, ref.y, 0, 0));
        EXPECT_TRUE(AllClose(dx, ref.dx, 0, 0));
      }
    }
  }
}

TEST(ActivationPoolCpuTest, MatchesNaiveReference) {
  CpuDevice cpu(0, 2);
  std::vector<Pool2dShape> shapes = TestShapes();
  shapes.push_back(MakePoolShape(4, 16, 32, 32, 2, 2, 0));  // spans several ParallelFor chunks
  for (const Pool2dShape& s : shapes) {
    for (PoolActivation act : {PoolActivation::kRelu, PoolActivation::kSigmoid}) {
      for (bool max : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << Name(act) << (max ? " max" : " avg") << " N" << s.batch << " C"
                     << s.channels << " " << s.height << "x" << s.width << " k" << s.kernel_h
                     << " s" << s.stride_h << " p" << s.pad_h);
        const std::vector<float> x = DistinctValues(InSize(s), 4e-3f, 13);
        const std::vector<float> dy = RandomVector(OutSize(s), 14);
        const Naive ref = RunNaive(act, max, s, x, dy);
        std::vector<float> a(InSize(s)), y(OutSize(s)), dx(InSize(s));
        std::vector<int32_t> argmax(OutSize(s));
        if (max) {
          ASSERT_TRUE(
              ActivationMaxPool2dForward(cpu, act, s, x.data(), a.data(), y.data(), argmax.data())
                  .ok());
          ASSERT_TRUE(ActivationMaxPool2dBackward(cpu, act, s, a.data(), dy.data(), argmax.data(),
                                                  dx.data())
                          .ok());
        } else {
          ASSERT_TRUE(ActivationAvgPool2dForward(cpu, act, s, x.data(), a.data(), y.data()).ok());
          ASSERT_TRUE(
              ActivationAvgPool2dBackward(cpu, act, s, a.data(), dy.data(), dx.data()).ok());
        }
        EXPECT_TRUE(AllClose(y, ref.y, 1e-6f, 1e-5f));
        EXPECT_TRUE(AllClose(dx, ref.dx, 1e-6f, 1e-5f));
      }
    }
  }
}

// Central differences of L = sum w * pool(act(x)) against the backward passes.
TEST(ActivationPoolCpuTest, BackwardMatchesFiniteDifferences) {
  CpuDevice cpu(0, 1);
  for (const Pool2dShape& s :
       {MakePoolShape(2, 2, 5, 6, 3, 2, 1), MakePoolShape(1, 2, 5, 4, 2, 2, 0),
        MakePoolShape(1, 1, 5, 5, 3, 1, 1)}) {
    const int64_t n_in = InSize(s), n_out = OutSize(s);
    const std::vector<float> x = DistinctValues(n_in, 0.05f, 3);
    const std::vector<float> w = RandomVector(n_out, 4);
    const float h = 1e-2f;  // < gap / 2: no tie and no ReLU kink is crossed
    for (PoolActivation act : {PoolActivation::kRelu, PoolActivation::kSigmoid}) {
      for (bool max : {true, false}) {
        SCOPED_TRACE(::testing::Message() << Name(act) << (max ? " max" : " avg"));
        std::vector<int32_t> argmax(n_out);
        std::vector<float> a(n_in);
        auto loss = [&](const std::vector<float>& in) {
          std::vector<float> y(n_out);
          const absl::Status st =
              max ? ActivationMaxPool2dForward(cpu, act, s, in.data(), a.data(), y.data(),
                                               argmax.data())
                  : ActivationAvgPool2dForward(cpu, act, s, in.data(), a.data(), y.data());
          EXPECT_TRUE(st.ok()) << st;
          double sum = 0;
          for (int64_t i = 0; i < n_out; ++i) sum += double(w[i]) * y[i];
          return sum;
        };
        std::vector<float> numeric(n_in);
        for (int64_t i = 0; i < n_in; ++i) {
          std::vector<float> xp = x, xm = x;
          xp[i] += h;
          xm[i] -= h;
          numeric[i] = static_cast<float>((loss(xp) - loss(xm)) / (2 * h));
        }
        loss(x);  // leaves the unperturbed activation and argmax behind
        std::vector<float> dx(n_in);
        const absl::Status st =
            max ? ActivationMaxPool2dBackward(cpu, act, s, a.data(), w.data(), argmax.data(),
                                              dx.data())
                : ActivationAvgPool2dBackward(cpu, act, s, a.data(), w.data(), dx.data());
        ASSERT_TRUE(st.ok()) << st;
        EXPECT_TRUE(AllClose(dx, numeric, 1e-3f, 1e-3f));
      }
    }
  }
}

TEST(ActivationPoolCpuTest, RejectsInvalidShape) {
  CpuDevice cpu(0, 1);
  const absl::Status st = ActivationAvgPool2dForward(
      cpu, PoolActivation::kSigmoid, MakePoolShape(1, 1, 4, 4, 2, 0, 0), nullptr, nullptr, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("stride_h"), absl::string_view::npos) << st;
  EXPECT_EQ(
      ActivationMaxPool2dBackward(cpu, PoolActivation::kRelu, MakePoolShape(1, 1, 4, 4, 2, 2, 3),
                                  nullptr, nullptr, nullptr, nullptr)
          .code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(ActivationPoolCudaTest, MatchesCpu) {
  PS_SKIP_WITHOUT_GPU();
  Device* gpu = testing::TestGpu();
  CpuDevice cpu(0, 2);
  std::vector<Pool2dShape> shapes = TestShapes();
  shapes.push_back(MakePoolShape(32, 64, 56, 56, 3, 2, 1));  // grid-stride loop
  for (const Pool2dShape& s : shapes) {
    for (PoolActivation act : {PoolActivation::kRelu, PoolActivation::kSigmoid}) {
      SCOPED_TRACE(::testing::Message()
                   << Name(act) << " N" << s.batch << " C" << s.channels << " " << s.height << "x"
                   << s.width << " k" << s.kernel_h << " s" << s.stride_h << " p" << s.pad_h);
      const int64_t n_in = InSize(s), n_out = OutSize(s);
      const std::vector<float> x = RandomVector(n_in, 21, -6.f, 6.f);
      const std::vector<float> dy = RandomVector(n_out, 22);
      std::vector<float> a(n_in), y(n_out), dx(n_in);
      std::vector<int32_t> argmax(n_out);
      DeviceBuffer gx(gpu, x), gdy(gpu, dy), ga(gpu, n_in), gy(gpu, n_out), gdx(gpu, n_in);
      auto gargmax_mem = gpu->Allocate(n_out * sizeof(int32_t));
      ASSERT_TRUE(gargmax_mem.ok()) << gargmax_mem.status();
      int32_t* gargmax = static_cast<int32_t*>(*gargmax_mem);

      ASSERT_TRUE(ActivationAvgPool2dForward(cpu, act, s, x.data(), a.data(), y.data()).ok());
      ASSERT_TRUE(ActivationAvgPool2dForward(*gpu, act, s, gx.data(), ga.data(), gy.data()).ok());
      EXPECT_TRUE(AllClose(ga.ToHost(), a, 1e-6f, 1e-5f));
      EXPECT_TRUE(AllClose(gy.ToHost(), y, 1e-6f, 1e-5f));
      ASSERT_TRUE(ActivationAvgPool2dBackward(cpu, act, s, a.data(), dy.data(), dx.data()).ok());
      ASSERT_TRUE(
          ActivationAvgPool2dBackward(*gpu, act, s, ga.data(), gdy.data(), gdx.data()).ok());
      EXPECT_TRUE(AllClose(gdx.ToHost(), dx, 1e-6f, 1e-5f));

      ASSERT_TRUE(
          ActivationMaxPool2dForward(cpu, act, s, x.data(), a.data(), y.data(), argmax.data())
              .ok());
      ASSERT_TRUE(
          ActivationMaxPool2dForward(*gpu, act, s, gx.data(), ga.data(), gy.data(), gargmax).ok());
      EXPECT_TRUE(AllClose(gy.ToHost(), y, 1e-6f, 1e-5f));
      // Backward from the CPU's argmax on both, so that a last-ulp difference
      // in the activation cannot move a maximum.
      ASSERT_TRUE(gpu->CopyHostToDevice(gargmax, argmax.data(), n_out * sizeof(int32_t)).ok());
      ASSERT_TRUE(
          ActivationMaxPool2dBackward(cpu, act, s, a.data(), dy.data(), argmax.data(), dx.data())
              .ok());
      ASSERT_TRUE(
          ActivationMaxPool2dBackward(*gpu, act, s, ga.data(), gdy.data(), gargmax, gdx.data())
              .ok());
      EXPECT_TRUE(AllClose(gdx.ToHost(), dx, 1e-6f, 1e-5f));
      gpu->Deallocate(gargmax);
    }
  }
}

}  // namespace
}  // namespace ps::kernels
