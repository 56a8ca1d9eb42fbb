#include "kernels/sgd.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include "common/cpu_device.h"
#include "kernels/sgd_cpu.h"
#include "kernels/test_util.h"

namespace ps::kernels {
namespace {

using testing::AllClose;
using testing::DeviceBuffer;
using testing::RandomVector;

// torch.optim.SGD's step (dampening 0) written the way PyTorch writes it, in
// double: the buffer is created as a copy of d_p on the first step rather
// than starting at zero, which the kernel's zero-initialised buffer must match.
struct TorchSgd {
  double lr = 0, momentum = 0, weight_decay = 0;
  bool nesterov = false;
  std::vector<double> param;
  std::vector<double> buf;  // empty until the first momentum step

  void Step(const std::vector<float>& grad, double grad_scale) {
    const bool first = buf.empty();
    if (first && momentum != 0) buf.resize(param.size());
    for (size_t i = 0; i < param.size(); ++i) {
      double d_p = grad_scale * grad[i];
      if (weight_decay != 0) d_p += weight_decay * param[i];
      if (momentum != 0) {
        buf[i] = first ? d_p : momentum * buf[i] + d_p;
        d_p = nesterov ? d_p + momentum * buf[i] : buf[i];
      }
      param[i] -= lr * d_p;
    }
  }
};

std::vector<float> ToFloat(const std::vector<double>& v) { return {v.begin(), v.end()}; }

TEST(SgdCpuTest, HandComputedSteps) {
  CpuDevice cpu(0, 1);
  SgdHyper hyper;
  hyper.lr = 0.1f;
  hyper.momentum = 0.9f;
  hyper.weight_decay = 0.1f;
  std::vector<float> grad = {2.f}, param = {1.f}, buf = {0.f};

  // step 1: g = 2 + 0.1 * 1 = 2.1; buf = 2.1; p = 1 - 0.1 * 2.1 = 0.79
  ASSERT_TRUE(SgdUpdate(cpu, 1, hyper, 1.f, grad.data(), param.data(), buf.data()).ok());
  EXPECT_TRUE(AllClose(buf, {2.1f}, 1e-6f, 1e-6f));
  EXPECT_TRUE(AllClose(param, {0.79f}, 1e-6f, 1e-6f));
  // step 2: g = 2 + 0.079 = 2.079; buf = 0.9 * 2.1 + 2.079 = 3.969;
  //         p = 0.79 - 0.3969 = 0.3931
  ASSERT_TRUE(SgdUpdate(cpu, 1, hyper, 1.f, grad.data(), param.data(), buf.data()).ok());
  EXPECT_TRUE(AllClose(buf, {3.969f}, 1e-6f, 1e-6f));
  EXPECT_TRUE(AllClose(param, {0.3931f}, 1e-6f, 1e-6f));

  // Nesterov, step 1: g = 2.1; buf = 2.1; d = 2.1 + 0.9 * 2.1 = 3.99;
  // p = 1 - 0.399 = 0.601
  hyper.nesterov = true;
  param = {1.f};
  buf = {0.f};
  ASSERT_TRUE(SgdUpdate(cpu, 1, hyper, 1.f, grad.data(), param.data(), buf.data()).ok());
  EXPECT_TRUE(AllClose(param, {0.601f}, 1e-6f, 1e-6f));

  // Plain SGD with grad_scale = 1/4 (a summed loss over 4 examples), no buffer.
  SgdHyper plain;
  plain.lr = 0.5f;
  param = {1.f};
  ASSERT_TRUE(SgdUpdate(cpu, 1, plain, 0.25f, grad.data(), param.data(), nullptr).ok());
  EXPECT_TRUE(AllClose(param, {0.75f}, 1e-7f, 1e-7f));  // 1 - 0.5 * 0.25 * 2
}

struct Mode {
  const char* name;
  SgdHyper hyper;
};

std::vector<Mode> Modes() {
  std::vector<Mode> modes(4);
  modes[0] = {"plain", {0.05f, 0.f, 0.f, false}};
  modes[1] = {"weight_decay", {0.05f, 0.f, 5e-4f, false}};
  modes[2] = {"momentum", {0.05f, 0.9f, 5e-4f, false}};
  modes[3] = {"nesterov", {0.05f, 0.9f, 5e-4f, true}};
  return modes;
}

TEST(SgdCpuTest, SeveralStepsMatchTorchFormula) {
  CpuDevice cpu(0, 2);
  const int64_t n = 100'003;  // spans several ParallelFor chunks
  const float grad_scale = 1.f / 32;
  for (const Mode& mode : Modes()) {
    SCOPED_TRACE(mode.name);
    const std::vector<float> init = RandomVector(n, 1, -2.f, 2.f);
    std::vector<float> param = init, buf(n, 0.f);
    TorchSgd ref;
    ref.lr = mode.hyper.lr;
    ref.momentum = mode.hyper.momentum;
    ref.weight_decay = mode.hyper.weight_decay;
    ref.nesterov = mode.hyper.nesterov;
    ref.param.assign(init.begin(), init.end());
    float* buf_ptr = mode.hyper.momentum != 0 ? buf.data() : nullptr;
    for (int step = 0; step < 5; ++step) {
      const std::vector<float> grad = RandomVector(n, 100 + step, -10.f, 10.f);
      ASSERT_TRUE(
          SgdUpdate(cpu, n, mode.hyper, grad_scale, grad.data(), param.data(), buf_ptr).ok());
      ref.Step(grad, grad_scale);
    }
    EXPECT_TRUE(AllClose(param, ToFloat(ref.param), 1e-6f, 1e-5f));
    if (buf_ptr != nullptr) {
      EXPECT_TRUE(AllClose(buf, ToFloat(ref.buf), 1e-6f, 1e-5f));
    }
  }
}

TEST(SgdCpuTest, RejectsBadArguments) {
  CpuDevice cpu(0, 1);
  float g = 1, p = 1, b = 0;
  auto expect_invalid = [&](const SgdHyper& hyper, float* buf, const char* field) {
    const absl::Status s = SgdUpdate(cpu, 1, hyper, 1.f, &g, &p, buf);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_NE(s.message().find(field), absl::string_view::npos) << s;
  };
  SgdHyper h;
  h.momentum = 0.9f;
  expect_invalid(h, nullptr, "momentum_buf");
  h = {};
  h.lr = -1.f;
  expect_invalid(h, &b, "lr");
  h = {};
  h.momentum = -0.5f;
  expect_invalid(h, &b, "momentum");
  h = {};
  h.weight_decay = -1e-4f;
  expect_invalid(h, &b, "weight_decay");
  h = {};
  h.nesterov = true;
  expect_invalid(h, &b, "nesterov");
  EXPECT_EQ(SgdUpdate(cpu, -1, SgdHyper{}, 1.f, &g, &p, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p, 1.f);  // nothing was touched
}

// The server's fused last term: the update reading the last worker's part
// in place (any alignment) equals adding it into the sum first, bit for bit,
// with and without a sum started, for every kind of update.
TEST(SgdCpuTest, AddingAnUnalignedAddendEqualsSummingFirstBitForBit) {
  CpuDevice cpu(0, 1);
  constexpr int64_t kN = 1001;
  const std::vector<float> grad = RandomVector(kN, 1);
  std::vector<float> addend = RandomVector(kN, 2);
  // Sums that depend on rounding, and signed zeros (0 + -0 is +0).
  addend[0] = -0.f;
  addend[1] = 1e8f;
  addend[2] = -grad[2];
  const std::vector<float> param = RandomVector(kN, 3);
  const std::vector<float> momentum = RandomVector(kN, 4);
  SgdHyper plain;
  plain.lr = 0.1f;
  SgdHyper heavy = plain;
  heavy.momentum = 0.9f;
  heavy.weight_decay = 1e-2f;
  SgdHyper nesterov = heavy;
  nesterov.nesterov = true;
  for (const SgdHyper& hyper : {plain, heavy, nesterov}) {
    for (const bool started : {true, false}) {
      for (const int misalign : {0, 1, 2, 3}) {
        SCOPED_TRACE(::testing::Message() << "momentum " << hyper.momentum << " nesterov "
                                        << hyper.nesterov << " sum started " << started
                                        << " misaligned by " << misalign);
        std::vector<char> bytes(kN * sizeof(float) + 4);
        std::memcpy(bytes.data() + misalign, addend.data(), kN * sizeof(float));
        std::vector<float> sum(kN);
        for (int64_t i = 0; i < kN; ++i) sum[i] = started ? grad[i] + addend[i] : addend[i] + 0.f;
        std::vector<float> want = param, want_momentum = momentum;
        ASSERT_TRUE(SgdUpdateCpu(cpu, kN, hyper, 0.25f, sum.data(), param.data(), want.data(),
                                 want_momentum.data())
                        .ok());
        std::vector<float> got(kN), got_momentum = momentum;
        ASSERT_TRUE(SgdUpdateAddingCpu(kN, hyper, 0.25f, started ? grad.data() : nullptr,
                                       bytes.data() + misalign, param.data(), got.data(),
                                       got_momentum.data())
                        .ok());
        EXPECT_EQ(std::memcmp(got.data(), want.data(), kN * sizeof(float)), 0);
        EXPECT_EQ(std::memcmp(got_momentum.data(), want_momentum.data(), kN * sizeof(float)), 0);
      }
    }
  }
  // Bad arguments are refused as SgdUpdateCpu refuses them, touching nothing.
  SgdHyper bad = heavy;
  bad.lr = -1.f;
  std::vector<float> out(kN, 7.f);
  EXPECT_EQ(SgdUpdateAddingCpu(kN, bad, 1.f, grad.data(), addend.data(), param.data(),
                               out.data(), nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out, std::vector<float>(kN, 7.f));
}

TEST(SgdCudaTest, MatchesCpu) {
  PS_SKIP_WITHOUT_GPU();
  Device* gpu = testing::TestGpu();
  CpuDevice cpu(0, 2);
  const int64_t n = 1'000'003;  // not a multiple of the block size
  const float grad_scale = 1.f / 256;
  for (const Mode& mode : Modes()) {
    SCOPED_TRACE(mode.name);
    std::vector<float> param = RandomVector(n, 5, -2.f, 2.f), buf(n, 0.f);
    DeviceBuffer gparam(gpu, param), gbuf(gpu, n), ggrad(gpu, n);
    const bool has_buf = mode.hyper.momentum != 0;
    for (int step = 0; step < 3; ++step) {
      const std::vector<float> grad = RandomVector(n, 200 + step, -10.f, 10.f);
      ASSERT_TRUE(gpu->CopyHostToDevice(ggrad.data(), grad.data(), n * sizeof(float)).ok());
      ASSERT_TRUE(SgdUpdate(cpu, n, mode.hyper, grad_scale, grad.data(), param.data(),
                            has_buf ? buf.data() : nullptr)
                      .ok());
      ASSERT_TRUE(SgdUpdate(*gpu, n, mode.hyper, grad_scale, ggrad.data(), gparam.data(),
                            has_buf ? gbuf.data() : nullptr)
                      .ok());
    }
    // nvcc contracts a * b + c into FMAs, so results differ by a few ulps.
    EXPECT_TRUE(AllClose(gparam.ToHost(), param, 1e-6f, 1e-5f));
    if (has_buf) {
      EXPECT_TRUE(AllClose(gbuf.ToHost(), buf, 1e-6f, 1e-5f));
    }
  }
}

}  // namespace
}  // namespace ps::kernels
