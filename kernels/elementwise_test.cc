#include "kernels/elementwise.h"

#include "common/cpu_device.h"
#include "kernels/test_util.h"

namespace ps::kernels {
namespace {

using testing::AllClose;
using testing::DeviceBuffer;
using testing::RandomVector;

TEST(ElementwiseCpuTest, AxpyScaleFillAdd) {
  CpuDevice cpu(0, 2);
  std::vector<float> x = {1, 2, 3}, y = {10, 20, 30}, out(3);
  ASSERT_TRUE(Axpy(cpu, 3, 2.f, x.data(), y.data()).ok());
  EXPECT_TRUE(AllClose(y, {12, 24, 36}, 0, 0));
  ASSERT_TRUE(Scale(cpu, 3, 0.5f, y.data()).ok());
  EXPECT_TRUE(AllClose(y, {6, 12, 18}, 0, 0));
  ASSERT_TRUE(Add(cpu, 3, x.data(), y.data(), out.data()).ok());
  EXPECT_TRUE(AllClose(out, {7, 14, 21}, 0, 0));
  ASSERT_TRUE(Fill(cpu, 3, -1.f, out.data()).ok());
  EXPECT_TRUE(AllClose(out, {-1, -1, -1}, 0, 0));
}

TEST(ElementwiseCudaTest, MatchesCpu) {
  PS_SKIP_WITHOUT_GPU();
  Device* gpu = testing::TestGpu();
  CpuDevice cpu(0, 1);
  const int64_t n = 1'000'003;  // not a multiple of the block size
  std::vector<float> x = RandomVector(n, 1), y = RandomVector(n, 2), sum(n);
  DeviceBuffer gx(gpu, x), gy(gpu, y), gsum(gpu, n);

  ASSERT_TRUE(Axpy(cpu, n, 0.3f, x.data(), y.data()).ok());
  ASSERT_TRUE(Axpy(*gpu, n, 0.3f, gx.data(), gy.data()).ok());
  EXPECT_TRUE(AllClose(gy.ToHost(), y, 1e-6f, 1e-6f));

  ASSERT_TRUE(Scale(cpu, n, -2.f, y.data()).ok());
  ASSERT_TRUE(Scale(*gpu, n, -2.f, gy.data()).ok());
  EXPECT_TRUE(AllClose(gy.ToHost(), y, 1e-6f, 1e-6f));

  ASSERT_TRUE(Add(cpu, n, x.data(), y.data(), sum.data()).ok());
  ASSERT_TRUE(Add(*gpu, n, gx.data(), gy.data(), gsum.data()).ok());
  EXPECT_TRUE(AllClose(gsum.ToHost(), sum, 1e-6f, 1e-6f));

  ASSERT_TRUE(Fill(*gpu, n, 4.f, gsum.data()).ok());
  EXPECT_TRUE(AllClose(gsum.ToHost(), std::vector<float>(n, 4.f), 0, 0));
}

}  // namespace
}  // namespace ps::kernels
