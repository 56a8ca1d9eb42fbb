#include "kernels/pool.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "common/cpu_device.h"
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

// Straight from the definition: visit every cell of the padded window; max
// pooling skips padding, average pooling counts it as zero.
struct NaivePool {
  std::vector<float> y;
  std::vector<int32_t> argmax;
};

NaivePool NaiveForward(const Pool2dShape& s, const std::vector<float>& x, bool max) {
  NaivePool out;
  const int64_t oh_n = s.out_height(), ow_n = s.out_width();
  for (int64_t plane = 0; plane < s.batch * s.channels; ++plane) {
    for (int64_t oh = 0; oh < oh_n; ++oh) {
      for (int64_t ow = 0; ow < ow_n; ++ow) {
        double sum = 0;
        float best = -std::numeric_limits<float>::infinity();
        int32_t best_i = -1;
        for (int64_t kh = 0; kh < s.kernel_h; ++kh) {
          for (int64_t kw = 0; kw < s.kernel_w; ++kw) {
            const int64_t h = oh * s.stride_h - s.pad_h + kh;
            const int64_t w = ow * s.stride_w - s.pad_w + kw;
            if (h < 0 || h >= s.height || w < 0 || w >= s.width) continue;
            const float v = x[(plane * s.height + h) * s.width + w];
            sum += v;
            if (best_i < 0 || v > best) {
              best = v;
              best_i = static_cast<int32_t>(h * s.width + w);
            }
          }
        }
        out.y.push_back(max ? best : static_cast<float>(sum / (s.kernel_h * s.kernel_w)));
        out.argmax.push_back(best_i);
      }
    }
  }
  return out;
}

// Scatter form of the backward passes (the kernels gather).
std::vector<float> NaiveMaxBackward(const Pool2dShape& s, const std::vector<float>& dy,
                                    const std::vector<int32_t>& argmax) {
  std::vector<double> dx(InSize(s), 0.0);
  const int64_t out_plane = s.out_height() * s.out_width(), in_plane = s.height * s.width;
  for (int64_t o = 0; o < OutSize(s); ++o) dx[o / out_plane * in_plane + argmax[o]] += dy[o];
  return {dx.begin(), dx.end()};
}

std::vector<float> NaiveAvgBackward(const Pool2dShape& s, const std::vector<float>& dy) {
  std::vector<double> dx(InSize(s), 0.0);
  const int64_t oh_n = s.out_height(), ow_n = s.out_width();
  for (int64_t plane = 0; plane < s.batch * s.channels; ++plane) {
    for (int64_t oh = 0; oh < oh_n; ++oh) {
      for (int64_t ow = 0; ow < ow_n; ++ow) {
        const double g = dy[(plane * oh_n + oh) * ow_n + ow] / double(s.kernel_h * s.kernel_w);
        for (int64_t kh = 0; kh < s.kernel_h; ++kh) {
          for (int64_t kw = 0; kw < s.kernel_w; ++kw) {
            const int64_t h = oh * s.stride_h - s.pad_h + kh;
            const int64_t w = ow * s.stride_w - s.pad_w + kw;
            if (h < 0 || h >= s.height || w < 0 || w >= s.width) continue;
            dx[(plane * s.height + h) * s.width + w] += g;
          }
        }
      }
    }
  }
  return {dx.begin(), dx.end()};
}

// Distinct values spaced `gap` apart, shuffled: max pooling has a unique
// maximum everywhere and a finite-difference step below gap / 2 never
// changes which cell wins.
std::vector<float> DistinctValues(int64_t n, float gap, uint64_t seed) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = (i - n / 2) * gap;
  std::shuffle(v.begin(), v.end(), std::mt19937_64(seed));
  return v;
}

// Layer shapes worth covering: the classic 2x2/2, ResNet's 3x3/2 pad 1,
// overlapping 3x3/1 pad 1, sizes that do not divide, rectangular windows.
std::vector<Pool2dShape> TestShapes() {
  std::vector<Pool2dShape> shapes = {
      MakePoolShape(2, 3, 8, 8, 2, 2, 0), MakePoolShape(2, 3, 9, 7, 3, 2, 1),
      MakePoolShape(1, 2, 6, 5, 3, 1, 1), MakePoolShape(3, 1, 7, 5, 2, 2, 0),
      MakePoolShape(1, 1, 1, 1, 1, 1, 0), MakePoolShape(2, 2, 5, 5, 5, 1, 2),
  };
  shapes.push_back(testing::RectangularPoolShape());
  return shapes;
}

TEST(PoolCpuTest, HandComputed2x2) {
  CpuDevice cpu(0, 1);
  const Pool2dShape s = MakePoolShape(1, 1, 4, 4, 2, 2, 0);
  const std::vector<float> x = {1,  2,  5, 3,  //
                                4,  0,  1, 1,  //
                                -1, -2, 7, 8,  //
                                -3, -4, 9, 6};
  std::vector<float> y(4), dx(16);
  std::vector<int32_t> argmax(4);
  ASSERT_TRUE(MaxPool2dForward(cpu, s, x.data(), y.data(), argmax.data()).ok());
  EXPECT_TRUE(AllClose(y, {4, 5, -1, 9}, 0, 0));
  EXPECT_EQ(argmax, (std::vector<int32_t>{4, 2, 8, 14}));
  const std::vector<float> dy = {10, 20, 30, 40};
  ASSERT_TRUE(MaxPool2dBackward(cpu, s, dy.data(), argmax.data(), dx.data()).ok());
  EXPECT_TRUE(AllClose(dx, {0, 0, 20, 0, 10, 0, 0, 0, 30, 0, 0, 0, 0, 0, 40, 0}, 0, 0));

  ASSERT_TRUE(AvgPool2dForward(cpu, s, x.data(), y.data()).ok());
  EXPECT_TRUE(AllClose(y, {1.75f, 2.5f, -2.5f, 7.5f}, 1e-7f, 0));
  ASSERT_TRUE(AvgPool2dBackward(cpu, s, dy.data(), dx.data()).ok());
  EXPECT_TRUE(
      AllClose(dx, {2.5, 2.5, 5, 5, 2.5, 2.5, 5, 5, 7.5, 7.5, 10, 10, 7.5, 7.5, 10, 10}, 1e-7f, 0));
}

TEST(PoolCpuTest, PaddingIsIgnoredByMaxAndCountedByAvg) {
  CpuDevice cpu(0, 1);
  // 3x3 window, stride 2, pad 1 over an all-negative 3x3 input: the padding
  // (0 for avg, -inf for max) must never win the max.
  const Pool2dShape s = MakePoolShape(1, 1, 3, 3, 3, 2, 1);
  ASSERT_EQ(s.out_height(), 2);
  const std::vector<float> x = {-1, -2, -3, -4, -5, -6, -7, -8, -9};
  std::vector<float> y(4);
  std::vector<int32_t> argmax(4);
  ASSERT_TRUE(MaxPool2dForward(cpu, s, x.data(), y.data(), argmax.data()).ok());
  EXPECT_TRUE(AllClose(y, {-1, -2, -4, -5}, 0, 0));
  EXPECT_EQ(argmax, (std::vector<int32_t>{0, 1, 3, 4}));
  ASSERT_TRUE(AvgPool2dForward(cpu, s, x.data(), y.data()).ok());
  // count_include_pad: always divided by 9.
  EXPECT_TRUE(AllClose(y, {-12.f / 9, -16.f / 9, -24.f / 9, -28.f / 9}, 1e-6f, 1e-6f));
}

TEST(PoolCpuTest, TiesPickFirstMaximum) {
  CpuDevice cpu(0, 1);
  const Pool2dShape s = MakePoolShape(1, 1, 2, 4, 2, 2, 0);
  const std::vector<float> x = {3, 3, 0, 1, 3, 3, 1, 1};
  std::vector<float> y(2);
  std::vector<int32_t> argmax(2);
  ASSERT_TRUE(MaxPool2dForward(cpu, s, x.data(), y.data(), argmax.data()).ok());
  EXPECT_EQ(argmax, (std::vector<int32_t>{0, 3}));
}

TEST(PoolCpuTest, MatchesNaiveReference) {
  CpuDevice cpu(0, 2);
  std::vector<Pool2dShape> shapes = TestShapes();
  shapes.push_back(MakePoolShape(4, 16, 32, 32, 2, 2, 0));  // spans several ParallelFor chunks
  for (const Pool2dShape& s : shapes) {
    SCOPED_TRACE(::testing::Message() << "N" << s.batch << " C" << s.channels << " " << s.height
                                      << "x" << s.width << " k" << s.kernel_h << "x" << s.kernel_w
                                      << " s" << s.stride_h << " p" << s.pad_h);
    const std::vector<float> x = RandomVector(InSize(s), 1);
    const std::vector<float> dy = RandomVector(OutSize(s), 2);
    std::vector<float> y(OutSize(s)), dx(InSize(s));
    std::vector<int32_t> argmax(OutSize(s));

    const NaivePool max_ref = NaiveForward(s, x, true);
    ASSERT_TRUE(MaxPool2dForward(cpu, s, x.data(), y.data(), argmax.data()).ok());
    EXPECT_TRUE(AllClose(y, max_ref.y, 0, 0));
    EXPECT_EQ(argmax, max_ref.argmax);
    ASSERT_TRUE(MaxPool2dBackward(cpu, s, dy.data(), argmax.data(), dx.data()).ok());
    EXPECT_TRUE(AllClose(dx, NaiveMaxBackward(s, dy, max_ref.argmax), 1e-6f, 1e-6f));

    const NaivePool avg_ref = NaiveForward(s, x, false);
    ASSERT_TRUE(AvgPool2dForward(cpu, s, x.data(), y.data()).ok());
    EXPECT_TRUE(AllClose(y, avg_ref.y, 1e-6f, 1e-5f));
    ASSERT_TRUE(AvgPool2dBackward(cpu, s, dy.data(), dx.data()).ok());
    EXPECT_TRUE(AllClose(dx, NaiveAvgBackward(s, dy), 1e-6f, 1e-5f));
  }
}

// Central differences of L = sum w * pool(x) against both backward passes.
TEST(PoolCpuTest, BackwardMatchesFiniteDifferences) {
  CpuDevice cpu(0, 1);
  for (const Pool2dShape& s :
       {MakePoolShape(2, 2, 5, 6, 3, 2, 1), MakePoolShape(1, 2, 4, 4, 2, 2, 0),
        MakePoolShape(1, 1, 5, 5, 3, 1, 1)}) {
    const int64_t n_in = InSize(s), n_out = OutSize(s);
    const std::vector<float> x = DistinctValues(n_in, 0.05f, 3);
    const std::vector<float> w = RandomVector(n_out, 4);
    const float h = 1e-2f;  // < gap / 2
    for (bool max : {true, false}) {
      SCOPED_TRACE(max ? "max" : "avg");
      std::vector<int32_t> argmax(n_out);
      auto loss = [&](const std::vector<float>& in) {
        std::vector<float> y(n_out);
        const absl::Status st = max ? MaxPool2dForward(cpu, s, in.data(), y.data(), argmax.data())
                                    : AvgPool2dForward(cpu, s, in.data(), y.data());
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
      loss(x);  // leaves the unperturbed argmax behind
      std::vector<float> dx(n_in);
      const absl::Status st = max ? MaxPool2dBackward(cpu, s, w.data(), argmax.data(), dx.data())
                                  : AvgPool2dBackward(cpu, s, w.data(), dx.data());
      ASSERT_TRUE(st.ok()) << st;
      EXPECT_TRUE(AllClose(dx, numeric, 1e-3f, 1e-3f));
    }
  }
}

TEST(PoolCpuTest, ValidationNamesTheField) {
  auto expect_invalid = [](const Pool2dShape& s, const char* field) {
    const absl::Status st = ValidatePool2dShape(s);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_NE(st.message().find(field), absl::string_view::npos) << st;
  };
  EXPECT_TRUE(ValidatePool2dShape(MakePoolShape(2, 3, 8, 8, 3, 2, 1)).ok());
  expect_invalid(MakePoolShape(2, 3, 8, 8, 2, 2, 2), "pad_h");
  Pool2dShape s = MakePoolShape(2, 3, 8, 8, 2, 2, 0);
  s.pad_w = -1;
  expect_invalid(s, "pad_w");
  expect_invalid(MakePoolShape(2, 3, 8, 8, 2, 0, 0), "stride_h");
  expect_invalid(MakePoolShape(2, 3, 8, 8, 0, 1, 0), "kernel_h");
  expect_invalid(MakePoolShape(2, 3, 2, 2, 3, 1, 0), "kernel_h");
  expect_invalid(MakePoolShape(-1, 3, 8, 8, 2, 2, 0), "batch");
  expect_invalid(MakePoolShape(1, 0, 8, 8, 2, 2, 0), "channels");
  expect_invalid(MakePoolShape(1, 1, 0, 8, 1, 1, 0), "height");
  expect_invalid(MakePoolShape(1, 1, 1 << 16, 1 << 16, 2, 2, 0), "height * width");
  s = MakePoolShape(1, 1, 8, 8, 2, 2, 0);
  s.kernel_w = 9;
  expect_invalid(s, "kernel_w");

  // The kernels refuse the shape too, without touching memory.
  CpuDevice cpu(0, 1);
  EXPECT_EQ(AvgPool2dForward(cpu, MakePoolShape(1, 1, 4, 4, 2, 0, 0), nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      MaxPool2dBackward(cpu, MakePoolShape(1, 1, 4, 4, 2, 2, 3), nullptr, nullptr, nullptr).code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(PoolCudaTest, MatchesCpu) {
  PS_SKIP_WITHOUT_GPU();
  Device* gpu = testing::TestGpu();
  CpuDevice cpu(0, 2);
  std::vector<Pool2dShape> shapes = TestShapes();
  shapes.push_back(MakePoolShape(32, 64, 56, 56, 3, 2, 1));  // ResNet stem pool, grid-stride loop
  for (const Pool2dShape& s : shapes) {
    SCOPED_TRACE(::testing::Message()
                 << "N" << s.batch << " C" << s.channels << " " << s.height << "x" << s.width
                 << " k" << s.kernel_h << " s" << s.stride_h << " p" << s.pad_h);
    const int64_t n_in = InSize(s), n_out = OutSize(s);
    const std::vector<float> x = RandomVector(n_in, 21), dy = RandomVector(n_out, 22);
    std::vector<float> y(n_out), dx(n_in);
    std::vector<int32_t> argmax(n_out);
    DeviceBuffer gx(gpu, x), gdy(gpu, dy), gy(gpu, n_out), gdx(gpu, n_in);
    auto gargmax_mem = gpu->Allocate(n_out * sizeof(int32_t));
    ASSERT_TRUE(gargmax_mem.ok()) << gargmax_mem.status();
    int32_t* gargmax = static_cast<int32_t*>(*gargmax_mem);

    ASSERT_TRUE(MaxPool2dForward(cpu, s, x.data(), y.data(), argmax.data()).ok());
    ASSERT_TRUE(MaxPool2dForward(*gpu, s, gx.data(), gy.data(), gargmax).ok());
    EXPECT_TRUE(AllClose(gy.ToHost(), y, 0, 0));
    std::vector<int32_t> gpu_argmax(n_out);
    ASSERT_TRUE(gpu->CopyDeviceToHost(gpu_argmax.data(), gargmax, n_out * sizeof(int32_t)).ok());
    EXPECT_EQ(gpu_argmax, argmax);
    ASSERT_TRUE(MaxPool2dBackward(cpu, s, dy.data(), argmax.data(), dx.data()).ok());
    ASSERT_TRUE(MaxPool2dBackward(*gpu, s, gdy.data(), gargmax, gdx.data()).ok());
    EXPECT_TRUE(AllClose(gdx.ToHost(), dx, 1e-6f, 1e-6f));

    ASSERT_TRUE(AvgPool2dForward(cpu, s, x.data(), y.data()).ok());
    ASSERT_TRUE(AvgPool2dForward(*gpu, s, gx.data(), gy.data()).ok());
    EXPECT_TRUE(AllClose(gy.ToHost(), y, 1e-6f, 1e-6f));
    ASSERT_TRUE(AvgPool2dBackward(cpu, s, dy.data(), dx.data()).ok());
    ASSERT_TRUE(AvgPool2dBackward(*gpu, s, gdy.data(), gdx.data()).ok());
    EXPECT_TRUE(AllClose(gdx.ToHost(), dx, 1e-6f, 1e-6f));
    gpu->Deallocate(gargmax);
  }
}

}  // namespace
}  // namespace ps::kernels
