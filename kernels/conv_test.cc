#include "kernels/conv.h"

#include <string>
#include <thread>
#include <vector>

#include "common/cpu_device.h"
#include "kernels/activation_pool.h"
#include "kernels/conv_cpu.h"
#include "kernels/conv_dnnl.h"
#include "kernels/gemm.h"
#include "kernels/test_util.h"

namespace ps::kernels {
namespace {

using testing::AllClose;
using testing::DeviceBuffer;
using testing::NumericGradient;
using testing::RandomVector;

Conv2dShape MakeShape(int64_t n, int64_t c, int64_t h, int64_t w, int64_t o, int64_t kh, int64_t kw,
                      int64_t sh, int64_t sw, int64_t ph, int64_t pw) {
  Conv2dShape s;
  s.batch = n;
  s.in_channels = c;
  s.height = h;
  s.width = w;
  s.out_channels = o;
  s.kernel_h = kh;
  s.kernel_w = kw;
  s.stride_h = sh;
  s.stride_w = sw;
  s.pad_h = ph;
  s.pad_w = pw;
  return s;
}

std::string Describe(const Conv2dShape& s) {
  return ::testing::PrintToString(std::vector<int64_t>{s.batch, s.in_channels, s.height, s.width,
                                                       s.out_channels, s.kernel_h, s.kernel_w,
                                                       s.stride_h, s.stride_w, s.pad_h, s.pad_w});
}

int64_t InSize(const Conv2dShape& s) { return s.batch * s.in_channels * s.height * s.width; }
int64_t WeightSize(const Conv2dShape& s) {
  return s.out_channels * s.in_channels * s.kernel_h * s.kernel_w;
}
int64_t OutSize(const Conv2dShape& s) {
  return s.batch * s.out_channels * s.out_height() * s.out_width();
}

// Shapes: LeNet's two layers (small batch), stride 2 with padding,
// non-square images, kernels and strides, batch 1, odd sizes, 1x1 kernels,
// a kernel as large as the padded image, and batches that the CPU splits
// into several blocks (with a short last block).
const Conv2dShape kShapes[] = {
    MakeShape(2, 1, 28, 28, 6, 5, 5, 1, 1, 2, 2),    // LeNet conv1
    MakeShape(3, 6, 14, 14, 16, 5, 5, 1, 1, 0, 0),   // LeNet conv2
    MakeShape(2, 3, 9, 9, 4, 3, 3, 2, 2, 1, 1),      // stride 2, padding
    MakeShape(2, 2, 7, 11, 3, 3, 2, 2, 1, 1, 0),     // non-square everything
    MakeShape(1, 3, 5, 6, 2, 2, 3, 1, 2, 0, 2),      // batch 1, odd
    MakeShape(3, 5, 6, 4, 7, 1, 1, 1, 1, 0, 0),      // pointwise
    MakeShape(1, 5, 6, 4, 7, 1, 1, 1, 1, 0, 0),      // pointwise, batch 1
    MakeShape(2, 4, 7, 7, 3, 1, 1, 2, 2, 0, 0),      // 1x1, stride 2
    MakeShape(2, 2, 3, 3, 2, 5, 5, 1, 1, 1, 1),      // 1x1 output
    MakeShape(1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0),      // scalar
    MakeShape(2, 2, 4, 4, 2, 3, 3, 3, 3, 2, 2),      // stride 3, output 2x2
    MakeShape(41, 6, 14, 14, 16, 5, 5, 1, 1, 0, 0),  // several blocks
    MakeShape(9, 1, 28, 28, 6, 5, 5, 1, 1, 2, 2),    // blocks of 2, then 1
    MakeShape(7, 64, 16, 16, 8, 3, 3, 1, 1, 1, 1),   // one sample per block
    MakeShape(3, 3, 9, 40, 5, 3, 3, 1, 1, 1, 1),     // odd O, wide rows
    MakeShape(2, 2, 6, 8, 3, 2, 7, 1, 1, 0, 3),      // 7-wide kernel, padded in w only
};

// Cross-correlation by the definition, in double.
std::vector<float> ReferenceForward(const Conv2dShape& s, const std::vector<float>& x,
                                    const std::vector<float>& w, const float* bias) {
  const int64_t oh = s.out_height(), ow = s.out_width();
  std::vector<float> y(OutSize(s));
  for (int64_t n = 0; n < s.batch; ++n) {
    for (int64_t o = 0; o < s.out_channels; ++o) {
      for (int64_t r = 0; r < oh; ++r) {
        for (int64_t q = 0; q < ow; ++q) {
          double sum = bias != nullptr ? bias[o] : 0.0;
          for (int64_t c = 0; c < s.in_channels; ++c) {
            for (int64_t i = 0; i < s.kernel_h; ++i) {
              for (int64_t j = 0; j < s.kernel_w; ++j) {
                const int64_t ih = r * s.stride_h - s.pad_h + i;
                const int64_t iw = q * s.stride_w - s.pad_w + j;
                if (ih < 0 || ih >= s.height || iw < 0 || iw >= s.width) continue;
                sum += double(x[((n * s.in_channels + c) * s.height + ih) * s.width + iw]) *
                       w[((o * s.in_channels + c) * s.kernel_h + i) * s.kernel_w + j];
              }
            }
          }
          y[((n * s.out_channels + o) * oh + r) * ow + q] = static_cast<float>(sum);
        }
      }
    }
  }
  return y;
}

struct Grads {
  std::vector<float> dx, dw, db;
};

Grads ReferenceBackward(const Conv2dShape& s, const std::vector<float>& x,
                        const std::vector<float>& w, const std::vector<float>& dy) {
  const int64_t oh = s.out_height(), ow = s.out_width();
  std::vector<double> dx(InSize(s)), dw(WeightSize(s)), db(s.out_channels);
  for (int64_t n = 0; n < s.batch; ++n) {
    for (int64_t o = 0; o < s.out_channels; ++o) {
      for (int64_t r = 0; r < oh; ++r) {
        for (int64_t q = 0; q < ow; ++q) {
          const double g = dy[((n * s.out_channels + o) * oh + r) * ow + q];
          db[o] += g;
          for (int64_t c = 0; c < s.in_channels; ++c) {
            for (int64_t i = 0; i < s.kernel_h; ++i) {
              for (int64_t j = 0; j < s.kernel_w; ++j) {
                const int64_t ih = r * s.stride_h - s.pad_h + i;
                const int64_t iw = q * s.stride_w - s.pad_w + j;
                if (ih < 0 || ih >= s.height || iw < 0 || iw >= s.width) continue;
                const int64_t xi = ((n * s.in_channels + c) * s.height + ih) * s.width + iw;
                const int64_t wi = ((o * s.in_channels + c) * s.kernel_h + i) * s.kernel_w + j;
                dx[xi] += g * w[wi];
                dw[wi] += g * x[xi];
              }
            }
          }
        }
      }
    }
  }
  return {std::vector<float>(dx.begin(), dx.end()), std::vector<float>(dw.begin(), dw.end()),
          std::vector<float>(db.begin(), db.end())};
}

// Which CPU path a check runs: conv.h's entry points (which choose per
// shape), conv_cpu.h's kernels, or oneDNN's in either method.
enum class CpuPath { kDispatch, kOurs, kDnnlPlain, kDnnlBlocked, kDnnlWinograd };

std::string PathName(CpuPath path) {
  switch (path) {
    case CpuPath::kDispatch:
      return "dispatch";
    case CpuPath::kOurs:
      return "ours";
    case CpuPath::kDnnlPlain:
      return "dnnl plain";
    case CpuPath::kDnnlBlocked:
      return "dnnl blocked";
    case CpuPath::kDnnlWinograd:
      return "dnnl winograd";
  }
  return "?";
}

internal::DnnlMethod MethodOf(CpuPath path) {
  switch (path) {
    case CpuPath::kDnnlPlain:
      return internal::DnnlMethod::kPlain;
    case CpuPath::kDnnlWinograd:
      return internal::DnnlMethod::kWinograd;
    default:
      return internal::DnnlMethod::kBlocked;
  }
}

absl::Status ForwardOn(CpuPath path, CpuDevice& cpu, const Conv2dShape& s, const float* x,
                       const float* w, const float* b, float* y) {
  switch (path) {
    case CpuPath::kDispatch:
      return Conv2dForward(cpu, s, x, w, b, y);
    case CpuPath::kOurs:
      return internal::Conv2dForwardCpu(cpu, s, x, w, b, y);
    default:
      return internal::Conv2dForwardDnnl(cpu, s, MethodOf(path), x, w, b, y);
  }
}

absl::Status BackwardOn(CpuPath path, CpuDevice& cpu, const Conv2dShape& s, const float* x,
                        const float* w, const float* dy, float* dx, float* dw, float* db) {
  switch (path) {
    case CpuPath::kDispatch:
      return Conv2dBackward(cpu, s, x, w, dy, dx, dw, db);
    case CpuPath::kOurs:
      return internal::Conv2dBackwardCpu(cpu, s, x, w, dy, dx, dw, db);
    default:
      return internal::Conv2dBackwardDnnl(cpu, s, MethodOf(path), x, w, dy, dx, dw, db);
  }
}

// ResNet-18's layer kinds at small batches (what conv.h sends to oneDNN):
// the 7x7 stem on one channel, 3x3 with and without stride, 1x1 strided
// shortcuts, a 1x1 image under a padded 3x3 kernel (only the centre tap is
// inside), and channel counts that are not multiples of oneDNN's 16-wide
// blocks.
const Conv2dShape kResNetShapes[] = {
    MakeShape(32, 1, 28, 28, 64, 7, 7, 2, 2, 3, 3),  // b1.conv
    MakeShape(3, 64, 7, 7, 64, 3, 3, 1, 1, 1, 1),    // stage1
    MakeShape(2, 64, 7, 7, 128, 3, 3, 2, 2, 1, 1),   // stage2.block0.conv1
    MakeShape(2, 64, 7, 7, 128, 1, 1, 2, 2, 0, 0),   // stage2.block0.conv3
    MakeShape(2, 32, 2, 2, 48, 3, 3, 1, 1, 1, 1),    // 2x2 image, O % 16 != 0
    MakeShape(3, 64, 1, 1, 32, 3, 3, 1, 1, 1, 1),    // stage4's 1x1 image
    MakeShape(17, 24, 5, 5, 40, 3, 3, 1, 1, 1, 1),   // odd batch and sizes
};

// Runs one CPU path on every shape against the reference, on a device with
// `threads` threads and BLAS set to `blas_threads` (which selects how our
// kernel spreads its blocks; see conv_cpu.h).
void CheckCpuAgainstReference(int threads, int blas_threads, CpuPath path = CpuPath::kOurs) {
  const ScopedBlasThreads blas(blas_threads);
  CpuDevice cpu(0, threads);
  uint64_t seed = 1;
  std::vector<Conv2dShape> shapes(std::begin(kShapes), std::end(kShapes));
  shapes.insert(shapes.end(), std::begin(kResNetShapes), std::end(kResNetShapes));
  for (const Conv2dShape& s : shapes) {
    SCOPED_TRACE(Describe(s) + " threads=" + std::to_string(threads) +
                 " blas_threads=" + std::to_string(blas_threads) + " path=" + PathName(path));
    ASSERT_TRUE(ValidateConv2dShape(s).ok()) << ValidateConv2dShape(s);
    const auto x = RandomVector(InSize(s), seed++);
    const auto w = RandomVector(WeightSize(s), seed++);
    const auto b = RandomVector(s.out_channels, seed++);
    const auto dy = RandomVector(OutSize(s), seed++);

    std::vector<float> y(OutSize(s), -7.f);
    ASSERT_TRUE(ForwardOn(path, cpu, s, x.data(), w.data(), b.data(), y.data()).ok());
    EXPECT_TRUE(AllClose(y, ReferenceForward(s, x, w, b.data()), 1e-4f, 1e-4f));
    ASSERT_TRUE(ForwardOn(path, cpu, s, x.data(), w.data(), nullptr, y.data()).ok());
    EXPECT_TRUE(AllClose(y, ReferenceForward(s, x, w, nullptr), 1e-4f, 1e-4f));

    // Outputs start as garbage: they must be overwritten, not accumulated.
    const Grads ref = ReferenceBackward(s, x, w, dy);
    std::vector<float> dx(x.size(), 9.f), dw(w.size(), 9.f), db(b.size(), 9.f);
    ASSERT_TRUE(
        BackwardOn(path, cpu, s, x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data())
            .ok());
    // dweight and dbias sum up to batch * OH * OW products.
    EXPECT_TRUE(AllClose(dx, ref.dx, 1e-4f, 1e-4f));
    EXPECT_TRUE(AllClose(dw, ref.dw, 1e-3f, 1e-4f));
    EXPECT_TRUE(AllClose(db, ref.db, 1e-3f, 1e-4f));
    std::fill(dw.begin(), dw.end(), 9.f);
    ASSERT_TRUE(
        BackwardOn(path, cpu, s, x.data(), w.data(), dy.data(), nullptr, dw.data(), nullptr).ok());
    EXPECT_TRUE(AllClose(dw, ref.dw, 1e-3f, 1e-4f));
    // Without dx (a model's first layer), with dbias.
    std::fill(dw.begin(), dw.end(), 9.f);
    std::fill(db.begin(), db.end(), 9.f);
    ASSERT_TRUE(
        BackwardOn(path, cpu, s, x.data(), w.data(), dy.data(), nullptr, dw.data(), db.data())
            .ok());
    EXPECT_TRUE(AllClose(dw, ref.dw, 1e-3f, 1e-4f));
    EXPECT_TRUE(AllClose(db, ref.db, 1e-3f, 1e-4f));
  }
}

TEST(ConvCpuTest, MatchesReferenceOnOneThread) { CheckCpuAgainstReference(1, 1); }

// Two device threads, each running whole blocks with single-threaded GEMMs.
TEST(ConvCpuTest, MatchesReferenceWithThreadsRunningBlocks) { CheckCpuAgainstReference(2, 1); }

// Two device threads and two GEMM threads: the threads run whole blocks and
// their GEMMs stay single-threaded inside those parts.
TEST(ConvCpuTest, MatchesReferenceWithThreadedBlas) { CheckCpuAgainstReference(2, 2); }

// oneDNN's primitives in both layouts, on one thread and on a team of two
// (the device's thread count becomes the OpenMP team's).
TEST(ConvDnnlTest, PlainMatchesReference) {
  CheckCpuAgainstReference(1, 1, CpuPath::kDnnlPlain);
  CheckCpuAgainstReference(2, 2, CpuPath::kDnnlPlain);
}

TEST(ConvDnnlTest, BlockedMatchesReference) {
  CheckCpuAgainstReference(1, 1, CpuPath::kDnnlBlocked);
  CheckCpuAgainstReference(2, 2, CpuPath::kDnnlBlocked);
}

// Winograd where oneDNN has it (3x3 stride 1, whole channel blocks: the
// stage-1 shape); the direct primitive computes the other shapes.
TEST(ConvDnnlTest, WinogradMatchesReference) {
  CheckCpuAgainstReference(1, 1, CpuPath::kDnnlWinograd);
  CheckCpuAgainstReference(2, 2, CpuPath::kDnnlWinograd);
}

// The speed chosen for ResNet comes from oneDNN's Winograd kernels: on the
// CPUs where they were measured, the shapes sent to them are computed by
// them, not by the direct primitive that stands in where they are missing.
TEST(ConvDnnlTest, WinogradKernelsRunTheShapesChosenForThem) {
  if (!internal::DnnlConvMeasuredHere()) GTEST_SKIP() << "no AVX-512: oneDNN is not chosen here";
  for (const Conv2dShape& s : {MakeShape(64, 64, 28, 28, 64, 3, 3, 1, 1, 1, 1),
                               MakeShape(32, 128, 14, 14, 128, 3, 3, 1, 1, 1, 1),
                               MakeShape(32, 512, 4, 4, 512, 3, 3, 1, 1, 1, 1)}) {
    SCOPED_TRACE(Describe(s));
    internal::DnnlMethod method;
    ASSERT_TRUE(internal::PreferDnnlConvForward(s, &method));
    EXPECT_EQ(method, internal::DnnlMethod::kWinograd);
    ASSERT_TRUE(internal::PreferDnnlConvBackward(s, true, &method));
    EXPECT_EQ(method, internal::DnnlMethod::kWinograd);
    for (internal::DnnlPass pass : {internal::DnnlPass::kForward, internal::DnnlPass::kBackwardData,
                                    internal::DnnlPass::kBackwardWeights}) {
      const absl::StatusOr<std::string> name =
          internal::DnnlConvImplementation(s, pass, internal::DnnlMethod::kWinograd);
      ASSERT_TRUE(name.ok()) << name.status();
      EXPECT_NE(name->find("wino"), std::string::npos) << *name;
    }
  }
}

// What conv.h's entry points choose per shape and pass.
TEST(ConvDnnlTest, DispatchMatchesReference) {
  CheckCpuAgainstReference(1, 1, CpuPath::kDispatch);
  CheckCpuAgainstReference(2, 2, CpuPath::kDispatch);
}

// The measured per-shape choice (conv_dnnl.cc): ResNet-18's 3x3 layers with
// enough output pixels per stride go to oneDNN forward, the strided entries
// to stages 3 and 4, the 1x1 shortcuts, stage 4's 1x1 images, the stem and
// LeNet's narrow layers stay ours; every ResNet backward with >= 32 output
// channels goes to oneDNN.
TEST(ConvDnnlTest, ChoosesThePathsMeasuredFasterPerShape) {
  struct Case {
    Conv2dShape shape;
    bool forward, backward, winograd;
  };
  const Case cases[] = {
      {MakeShape(64, 1, 28, 28, 64, 7, 7, 2, 2, 3, 3), false, true, false},    // b1.conv (no dx)
      {MakeShape(64, 64, 7, 7, 64, 3, 3, 1, 1, 1, 1), true, true, true},       // stage1
      {MakeShape(64, 64, 7, 7, 128, 3, 3, 2, 2, 1, 1), true, true, false},     // stage2.block0.conv1
      {MakeShape(64, 128, 4, 4, 128, 3, 3, 1, 1, 1, 1), true, true, true},     // stage2
      {MakeShape(64, 64, 7, 7, 128, 1, 1, 2, 2, 0, 0), false, true, false},    // stage2 shortcut
      {MakeShape(64, 128, 4, 4, 256, 3, 3, 2, 2, 1, 1), false, true, false},   // stage3.block0.conv1
      {MakeShape(64, 256, 2, 2, 256, 3, 3, 1, 1, 1, 1), true, true, false},    // stage3
      {MakeShape(64, 256, 2, 2, 512, 3, 3, 2, 2, 1, 1), false, true, false},   // stage4.block0.conv1
      {MakeShape(64, 512, 1, 1, 512, 3, 3, 1, 1, 1, 1), false, true, false},   // stage4
      {MakeShape(64, 64, 28, 28, 64, 3, 3, 1, 1, 1, 1), true, true, true},     // cifar stage1
      {MakeShape(64, 256, 7, 7, 256, 3, 3, 1, 1, 1, 1), true, true, true},     // cifar stage3
      {MakeShape(64, 1, 28, 28, 64, 3, 3, 1, 1, 1, 1), false, true, false},    // cifar b1.conv
      {MakeShape(256, 6, 14, 14, 16, 5, 5, 1, 1, 0, 0), false, false, false},  // LeNet conv2
  };
  // Measured on CPUs with AVX-512 only: elsewhere every shape stays ours.
  const bool measured = internal::DnnlConvMeasuredHere();
  EXPECT_EQ(measured, __builtin_cpu_supports("avx512f") != 0);
  for (const Case& c : cases) {
    SCOPED_TRACE(Describe(c.shape));
    internal::DnnlMethod method;
    EXPECT_EQ(internal::PreferDnnlConvForward(c.shape, &method), measured && c.forward);
    if (measured && c.forward) {
      EXPECT_EQ(method == internal::DnnlMethod::kWinograd, c.winograd);
    }
    const bool need_dx = c.shape.in_channels > 1;
    EXPECT_EQ(internal::PreferDnnlConvBackward(c.shape, need_dx, &method),
              measured && c.backward);
    if (measured && c.backward) {
      EXPECT_EQ(method == internal::DnnlMethod::kWinograd, c.winograd);
    }
  }
}

// Two devices of one thread each run the same primitives at once (each
// call its own memory and scratchpad), as two model replicas do.
TEST(ConvDnnlTest, ConcurrentCallsFromTwoDevices) {
  const Conv2dShape s = MakeShape(8, 64, 7, 7, 64, 3, 3, 1, 1, 1, 1);
  const auto w = RandomVector(WeightSize(s), 1);
  const auto b = RandomVector(s.out_channels, 2);
  std::vector<std::vector<float>> x, y;
  for (int d = 0; d < 2; ++d) {
    x.push_back(RandomVector(InSize(s), 3 + d));
    y.emplace_back(OutSize(s));
  }
  std::vector<std::thread> threads;
  std::vector<absl::Status> status(2);
  for (int d = 0; d < 2; ++d) {
    threads.emplace_back([&, d] {
      CpuDevice cpu(d, 1);
      for (int i = 0; i < 20 && status[d].ok(); ++i) {
        status[d] = internal::Conv2dForwardDnnl(cpu, s, internal::DnnlMethod::kBlocked,
                                                x[d].data(), w.data(), b.data(), y[d].data());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int d = 0; d < 2; ++d) {
    ASSERT_TRUE(status[d].ok()) << status[d];
    EXPECT_TRUE(AllClose(y[d], ReferenceForward(s, x[d], w, b.data()), 1e-4f, 1e-4f));
  }
}

// Central differences of L = sum(y * g), which is linear in each of x,
// weight and bias, so the only error is rounding.
void CheckNumericGradient(CpuPath path) {
  CpuDevice cpu(0, 1);
  for (const Conv2dShape& s :
       {MakeShape(2, 2, 5, 6, 3, 3, 3, 2, 2, 1, 1), MakeShape(1, 3, 4, 5, 2, 2, 3, 1, 2, 1, 0),
        MakeShape(2, 16, 3, 3, 32, 3, 3, 1, 1, 1, 1), MakeShape(2, 16, 4, 4, 32, 1, 1, 2, 2, 0, 0)}) {
    SCOPED_TRACE(Describe(s) + " path=" + PathName(path));
    auto x = RandomVector(InSize(s), 1);
    auto w = RandomVector(WeightSize(s), 2);
    auto b = RandomVector(s.out_channels, 3);
    const auto g = RandomVector(OutSize(s), 4);
    auto loss = [&]() {
      std::vector<float> y(OutSize(s));
      EXPECT_TRUE(ForwardOn(path, cpu, s, x.data(), w.data(), b.data(), y.data()).ok());
      double l = 0;
      for (size_t i = 0; i < y.size(); ++i) l += double(y[i]) * g[i];
      return l;
    };
    std::vector<float> dx(x.size()), dw(w.size()), db(b.size());
    ASSERT_TRUE(
        BackwardOn(path, cpu, s, x.data(), w.data(), g.data(), dx.data(), dw.data(), db.data())
            .ok());
    // Sums of up to 144 products per output: float32 rounding in the loss
    // over a 2e-2 step.
    EXPECT_TRUE(AllClose(dx, NumericGradient(&x, 1e-2f, loss), 2e-3f, 1e-3f));
    EXPECT_TRUE(AllClose(dw, NumericGradient(&w, 1e-2f, loss), 2e-3f, 1e-3f));
    EXPECT_TRUE(AllClose(db, NumericGradient(&b, 1e-2f, loss), 2e-3f, 1e-3f));
  }
}

TEST(ConvCpuTest, BackwardMatchesNumericGradient) { CheckNumericGradient(CpuPath::kOurs); }

TEST(ConvDnnlTest, BackwardMatchesNumericGradient) {
  CheckNumericGradient(CpuPath::kDnnlPlain);
  CheckNumericGradient(CpuPath::kDnnlBlocked);
  CheckNumericGradient(CpuPath::kDnnlWinograd);
}

TEST(ConvTest, ValidateNamesTheBadField) {
  const Conv2dShape good = MakeShape(2, 3, 8, 8, 4, 3, 3, 1, 1, 1, 1);
  EXPECT_TRUE(ValidateConv2dShape(good).ok());
  struct BadCase {
    const char* field;
    Conv2dShape shape;
  };
  std::vector<BadCase> cases;
  auto with = [&](const char* field, auto mutate) {
    Conv2dShape s = good;
    mutate(s);
    cases.push_back({field, s});
  };
  with("batch", [](Conv2dShape& s) { s.batch = 0; });
  with("in_channels", [](Conv2dShape& s) { s.in_channels = -1; });
  with("height", [](Conv2dShape& s) { s.height = 0; });
  with("width", [](Conv2dShape& s) { s.width = -3; });
  with("out_channels", [](Conv2dShape& s) { s.out_channels = 0; });
  with("kernel_h", [](Conv2dShape& s) { s.kernel_h = 0; });
  with("kernel_w", [](Conv2dShape& s) { s.kernel_w = -1; });
  with("stride_h", [](Conv2dShape& s) { s.stride_h = 0; });
  with("stride_w", [](Conv2dShape& s) { s.stride_w = 0; });
  with("pad_h", [](Conv2dShape& s) { s.pad_h = -1; });
  with("pad_w", [](Conv2dShape& s) { s.pad_w = -2; });
  with("kernel_h", [](Conv2dShape& s) { s.kernel_h = 11; });  // > 8 + 2 * 1: empty output
  with("kernel_w", [](Conv2dShape& s) {
    s.pad_w = 0;
    s.kernel_w = 9;
  });
  with("in_channels * kernel_h * kernel_w", [](Conv2dShape& s) { s.in_channels = 1 << 30; });
  for (const BadCase& bad : cases) {
    const absl::Status status = ValidateConv2dShape(bad.shape);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad.field;
    EXPECT_NE(status.message().find(bad.field), absl::string_view::npos)
        << "expected '" << bad.field << "' in: " << status;
  }

  // The entry points validate too, and return rather than crash.
  CpuDevice cpu(0, 1);
  std::vector<float> buf(1024);
  float* p = buf.data();
  Conv2dShape bad = good;
  bad.stride_w = 0;
  EXPECT_EQ(Conv2dForward(cpu, bad, p, p, p, p).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Conv2dBackward(cpu, bad, p, p, p, p, p, p).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Conv2dForward(cpu, good, nullptr, p, p, p).code(), absl::StatusCode::kInvalidArgument);
}

// --- convolution with a fused activation and pooling ---

// Pooling over the convolution's output with window k, stride st, pad p.
ConvActivationPool MakeEpilogue(const Conv2dShape& s, PoolActivation act, bool max, int64_t k,
                                int64_t st, int64_t p) {
  ConvActivationPool e;
  e.activation = act;
  e.max = max;
  e.pool.batch = s.batch;
  e.pool.channels = s.out_channels;
  e.pool.height = s.out_height();
  e.pool.width = s.out_width();
  e.pool.kernel_h = e.pool.kernel_w = k;
  e.pool.stride_h = e.pool.stride_w = st;
  e.pool.pad_h = e.pool.pad_w = p;
  return e;
}

int64_t PooledSize(const ConvActivationPool& e) {
  return e.pool.batch * e.pool.channels * e.pool.out_height() * e.pool.out_width();
}

struct FusedResult {
  std::vector<float> a, y, dx, dw, db;
  std::vector<int32_t> argmax;
};

// The fused kernels, or (unfused) Conv2dForward/Backward around
// activation_pool.h's kernels.
FusedResult RunConvActivationPool(Device& device, bool fused, const Conv2dShape& s,
                                  const ConvActivationPool& e, const std::vector<float>& x,
                                  const std::vector<float>& w, const std::vector<float>& b,
                                  const std::vector<float>& dy) {
  FusedResult r{std::vector<float>(OutSize(s)), std::vector<float>(PooledSize(e)),
                std::vector<float>(x.size(), 9.f), std::vector<float>(w.size(), 9.f),
                std::vector<float>(b.size(), 9.f), std::vector<int32_t>(PooledSize(e))};
  if (fused) {
    EXPECT_TRUE(Conv2dActivationPoolForward(device, s, e, x.data(), w.data(), b.data(),
                                            r.a.data(), r.y.data(), r.argmax.data())
                    .ok());
    EXPECT_TRUE(Conv2dActivationPoolBackward(device, s, e, x.data(), w.data(), r.a.data(),
                                             dy.data(), r.argmax.data(), r.dx.data(),
                                             r.dw.data(), r.db.data())
                    .ok());
    return r;
  }
  // The unfused reference is our own convolution (the one the fused kernels
  // build on), whichever path conv.h would choose for the shape.
  std::vector<float> conv(OutSize(s)), dconv(OutSize(s));
  EXPECT_TRUE(
      internal::Conv2dForwardCpu(AsCpu(device), s, x.data(), w.data(), b.data(), conv.data())
          .ok());
  if (e.max) {
    EXPECT_TRUE(ActivationMaxPool2dForward(device, e.activation, e.pool, conv.data(), r.a.data(),
                                           r.y.data(), r.argmax.data())
                    .ok());
    EXPECT_TRUE(ActivationMaxPool2dBackward(device, e.activation, e.pool, r.a.data(), dy.data(),
                                            r.argmax.data(), dconv.data())
                    .ok());
  } else {
    EXPECT_TRUE(ActivationAvgPool2dForward(device, e.activation, e.pool, conv.data(), r.a.data(),
                                           r.y.data())
                    .ok());
    EXPECT_TRUE(ActivationAvgPool2dBackward(device, e.activation, e.pool, r.a.data(), dy.data(),
                                            dconv.data())
                    .ok());
  }
  EXPECT_TRUE(internal::Conv2dBackwardCpu(AsCpu(device), s, x.data(), w.data(), dconv.data(),
                                          r.dx.data(), r.dw.data(), r.db.data())
                  .ok());
  return r;
}

// The CPU's fused epilogue computes exactly what the separate kernels do:
// the same GEMMs, the bias added the same way, the same plane functions.
TEST(ConvActivationPoolCpuTest, BitIdenticalToSeparateKernels) {
  for (int threads : {1, 2}) {
    CpuDevice cpu(0, threads);
    uint64_t seed = 300;
    for (const Conv2dShape& s :
         {MakeShape(9, 1, 28, 28, 6, 5, 5, 1, 1, 2, 2), MakeShape(5, 6, 14, 14, 16, 5, 5, 1, 1, 0, 0),
          MakeShape(1, 3, 9, 9, 4, 3, 3, 1, 1, 1, 1), MakeShape(3, 2, 11, 9, 3, 3, 3, 2, 2, 1, 1)}) {
      for (PoolActivation act : {PoolActivation::kSigmoid, PoolActivation::kRelu}) {
        for (bool max : {false, true}) {
          const ConvActivationPool e =
              max ? MakeEpilogue(s, act, true, 3, 2, 1) : MakeEpilogue(s, act, false, 2, 2, 0);
          SCOPED_TRACE(Describe(s) + (max ? " max" : " avg") +
                       (act == PoolActivation::kRelu ? " relu" : " sigmoid") +
                       " threads=" + std::to_string(threads));
          const auto x = RandomVector(InSize(s), seed++);
          const auto w = RandomVector(WeightSize(s), seed++);
          const auto b = RandomVector(s.out_channels, seed++);
          const auto dy = RandomVector(PooledSize(e), seed++);
          const FusedResult fused = RunConvActivationPool(cpu, true, s, e, x, w, b, dy);
          const FusedResult ref = RunConvActivationPool(cpu, false, s, e, x, w, b, dy);
          EXPECT_TRUE(AllClose(fused.a, ref.a, 0, 0));
          EXPECT_TRUE(AllClose(fused.y, ref.y, 0, 0));
          if (max) {
            EXPECT_EQ(fused.argmax, ref.argmax);
          }
          EXPECT_TRUE(AllClose(fused.dx, ref.dx, 0, 0));
          EXPECT_TRUE(AllClose(fused.dw, ref.dw, 0, 0));
          EXPECT_TRUE(AllClose(fused.db, ref.db, 0, 0));
        }
      }
    }
  }
}

// Central differences of L = sum(y * g) through the whole fused layer.
TEST(ConvActivationPoolCpuTest, BackwardMatchesNumericGradient) {
  CpuDevice cpu(0, 1);
  const Conv2dShape s = MakeShape(2, 2, 6, 6, 3, 3, 3, 1, 1, 1, 1);
  const ConvActivationPool e = MakeEpilogue(s, PoolActivation::kSigmoid, false, 2, 2, 0);
  auto x = RandomVector(InSize(s), 1);
  auto w = RandomVector(WeightSize(s), 2);
  auto b = RandomVector(s.out_channels, 3);
  const auto g = RandomVector(PooledSize(e), 4);
  auto loss = [&]() {
    std::vector<float> a(OutSize(s)), y(PooledSize(e));
    EXPECT_TRUE(Conv2dActivationPoolForward(cpu, s, e, x.data(), w.data(), b.data(), a.data(),
                                            y.data(), nullptr)
                    .ok());
    double sum = 0;
    for (size_t i = 0; i < y.size(); ++i) sum += double(y[i]) * g[i];
    return sum;
  };
  const FusedResult r = RunConvActivationPool(cpu, true, s, e, x, w, b, g);
  const std::vector<float> ndx = NumericGradient(&x, 1e-2f, loss);
  const std::vector<float> ndw = NumericGradient(&w, 1e-2f, loss);
  const std::vector<float> ndb = NumericGradient(&b, 1e-2f, loss);
  EXPECT_TRUE(AllClose(r.dx, ndx, 1e-3f, 1e-2f));
  EXPECT_TRUE(AllClose(r.dw, ndw, 1e-3f, 1e-2f));
  EXPECT_TRUE(AllClose(r.db, ndb, 1e-3f, 1e-2f));
}

TEST(ConvActivationPoolCpuTest, RejectsPoolingThatDoesNotFitTheOutput) {
  CpuDevice cpu(0, 1);
  const Conv2dShape s = MakeShape(2, 1, 8, 8, 3, 3, 3, 1, 1, 1, 1);
  ConvActivationPool e = MakeEpilogue(s, PoolActivation::kSigmoid, false, 2, 2, 0);
  e.pool.channels = 4;
  std::vector<float> buf(4096);
  const absl::Status st = Conv2dActivationPoolForward(cpu, s, e, buf.data(), buf.data(), nullptr,
                                                      buf.data(), buf.data(), nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  e = MakeEpilogue(s, PoolActivation::kSigmoid, true, 2, 2, 0);
  EXPECT_EQ(Conv2dActivationPoolForward(cpu, s, e, buf.data(), buf.data(), nullptr, buf.data(),
                                        buf.data(), nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);  // max pooling without argmax
}

// The GPU's composition (convolution, then activation and pooling) against
// the CPU's fused kernels.
TEST(ConvActivationPoolCudaTest, MatchesCpu) {
  PS_SKIP_WITHOUT_GPU();
  Device* gpu = testing::TestGpu();
  CpuDevice cpu(0, 1);
  uint64_t seed = 400;
  for (const Conv2dShape& s :
       {MakeShape(256, 1, 28, 28, 6, 5, 5, 1, 1, 2, 2), MakeShape(9, 6, 14, 14, 16, 5, 5, 1, 1, 0, 0),
        MakeShape(3, 2, 11, 9, 3, 3, 3, 2, 2, 1, 1)}) {
    for (bool max : {false, true}) {
      const PoolActivation act = max ? PoolActivation::kRelu : PoolActivation::kSigmoid;
      const ConvActivationPool e =
          max ? MakeEpilogue(s, act, true, 3, 2, 1) : MakeEpilogue(s, act, false, 2, 2, 0);
      SCOPED_TRACE(Describe(s) + (max ? " relu max" : " sigmoid avg"));
      const auto x = RandomVector(InSize(s), seed++);
      const auto w = RandomVector(WeightSize(s), seed++);
      const auto b = RandomVector(s.out_channels, seed++);
      const auto dy = RandomVector(PooledSize(e), seed++);
      const FusedResult ref = RunConvActivationPool(cpu, true, s, e, x, w, b, dy);
      DeviceBuffer gx(gpu, x), gw(gpu, w), gb(gpu, b), gdy(gpu, dy);
      DeviceBuffer ga(gpu, OutSize(s)), gy(gpu, PooledSize(e)), gdx(gpu, x.size()),
          gdw(gpu, w.size()), gdb(gpu, b.size());
      auto gargmax_mem = gpu->Allocate(PooledSize(e) * sizeof(int32_t));
      ASSERT_TRUE(gargmax_mem.ok()) << gargmax_mem.status();
      int32_t* gargmax = static_cast<int32_t*>(*gargmax_mem);
      ASSERT_TRUE(Conv2dActivationPoolForward(*gpu, s, e, gx.data(), gw.data(), gb.data(),
                                              ga.data(), gy.data(), gargmax)
                      .ok());
      EXPECT_TRUE(AllClose(ga.ToHost(), ref.a, 1e-4f, 1e-4f));
      EXPECT_TRUE(AllClose(gy.ToHost(), ref.y, 1e-4f, 1e-4f));
      // Backward from the CPU's a and argmax, so that a last-ulp difference
      // cannot move a maximum.
      DeviceBuffer ga_cpu(gpu, ref.a);
      ASSERT_TRUE(gpu->CopyHostToDevice(gargmax, ref.argmax.data(),
                                        PooledSize(e) * sizeof(int32_t))
                      .ok());
      ASSERT_TRUE(Conv2dActivationPoolBackward(*gpu, s, e, gx.data(), gw.data(), ga_cpu.data(),
                                               gdy.data(), gargmax, gdx.data(), gdw.data(),
                                               gdb.data())
                      .ok());
      EXPECT_TRUE(AllClose(gdx.ToHost(), ref.dx, 1e-4f, 1e-4f));
      EXPECT_TRUE(AllClose(gdw.ToHost(), ref.dw, 1e-2f, 1e-4f));
      EXPECT_TRUE(AllClose(gdb.ToHost(), ref.db, 1e-2f, 1e-4f));
      gpu->Deallocate(gargmax);
    }
  }
}

TEST(ConvCudaTest, MatchesCpu) {
  PS_SKIP_WITHOUT_GPU();
  Device* gpu = testing::TestGpu();
  CpuDevice cpu(0, 1);
  uint64_t seed = 100;
  std::vector<Conv2dShape> shapes(std::begin(kShapes), std::end(kShapes));
  shapes.push_back(MakeShape(256, 1, 28, 28, 6, 5, 5, 1, 1, 2, 2));  // LeNet at batch 256
  shapes.push_back(MakeShape(256, 6, 14, 14, 16, 5, 5, 1, 1, 0, 0));
  for (const Conv2dShape& s : shapes) {
    SCOPED_TRACE(Describe(s));
    const auto x = RandomVector(InSize(s), seed++);
    const auto w = RandomVector(WeightSize(s), seed++);
    const auto b = RandomVector(s.out_channels, seed++);
    const auto dy = RandomVector(OutSize(s), seed++);
    DeviceBuffer gx(gpu, x), gw(gpu, w), gb(gpu, b), gdy(gpu, dy);
    DeviceBuffer gy(gpu, OutSize(s)), gdx(gpu, x.size()), gdw(gpu, w.size()), gdb(gpu, b.size());

    std::vector<float> y(OutSize(s));
    ASSERT_TRUE(Conv2dForward(cpu, s, x.data(), w.data(), b.data(), y.data()).ok());
    ASSERT_TRUE(Conv2dForward(*gpu, s, gx.data(), gw.data(), gb.data(), gy.data()).ok());
    EXPECT_TRUE(AllClose(gy.ToHost(), y, 1e-4f, 1e-4f));
    ASSERT_TRUE(Conv2dForward(cpu, s, x.data(), w.data(), nullptr, y.data()).ok());
    ASSERT_TRUE(Conv2dForward(*gpu, s, gx.data(), gw.data(), nullptr, gy.data()).ok());
    EXPECT_TRUE(AllClose(gy.ToHost(), y, 1e-4f, 1e-4f));

    std::vector<float> dx(x.size()), dw(w.size()), db(b.size());
    ASSERT_TRUE(
        Conv2dBackward(cpu, s, x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data())
            .ok());
    ASSERT_TRUE(Conv2dBackward(*gpu, s, gx.data(), gw.data(), gdy.data(), gdx.data(), gdw.data(),
                               gdb.data())
                    .ok());
    EXPECT_TRUE(AllClose(gdx.ToHost(), dx, 1e-4f, 1e-4f));
    // Long sums (up to 256 * 28 * 28 terms) in different orders.
    EXPECT_TRUE(AllClose(gdw.ToHost(), dw, 1e-2f, 1e-4f));
    EXPECT_TRUE(AllClose(gdb.ToHost(), db, 1e-2f, 1e-4f));

    // dx and dbias may be skipped.
    ASSERT_TRUE(
        Conv2dBackward(*gpu, s, gx.data(), gw.data(), gdy.data(), nullptr, gdw.data(), nullptr)
            .ok());
    EXPECT_TRUE(AllClose(gdw.ToHost(), dw, 1e-2f, 1e-4f));
  }
  Conv2dShape bad = kShapes[0];
  bad.kernel_h = 0;
  DeviceBuffer buf(gpu, 16);
  EXPECT_EQ(Conv2dForward(*gpu, bad, buf.data(), buf.data(), nullptr, buf.data()).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ps::kernels
