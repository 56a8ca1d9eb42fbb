#include "kernels/test_util.h"

#include <cmath>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"

namespace ps::kernels::testing {

std::vector<float> RandomVector(int64_t n, uint64_t seed, float lo, float hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

::testing::AssertionResult AllClose(absl::Span<const float> actual,
                                    absl::Span<const float> expected, float atol, float rtol) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << "size " << actual.size() << " != expected size " << expected.size();
  }
  double max_abs = 0, max_rel = 0;
  int64_t worst = -1;
  double worst_excess = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double diff = std::fabs(double(actual[i]) - double(expected[i]));
    const double tol = atol + rtol * std::fabs(double(expected[i]));
    if (std::isnan(actual[i]) != std::isnan(expected[i])) {
      return ::testing::AssertionFailure() << "NaN mismatch at " << i << ": " << actual[i]
                                           << " vs expected " << expected[i];
    }
    max_abs = std::max(max_abs, diff);
    if (expected[i] != 0) max_rel = std::max(max_rel, diff / std::fabs(double(expected[i])));
    if (diff - tol > worst_excess) {
      worst_excess = diff - tol;
      worst = static_cast<int64_t>(i);
    }
  }
  if (worst >= 0) {
    return ::testing::AssertionFailure()
           << "element " << worst << ": " << actual[worst] << " vs expected " << expected[worst]
           << " (atol " << atol << ", rtol " << rtol << "); max abs err " << max_abs
           << ", max rel err " << max_rel << " over " << actual.size() << " elements";
  }
  return ::testing::AssertionSuccess() << "max abs err " << max_abs << ", max rel err " << max_rel;
}

std::vector<float> NumericGradient(std::vector<float>* param, float h,
                                   const std::function<double()>& loss) {
  std::vector<float> grad(param->size());
  for (size_t i = 0; i < param->size(); ++i) {
    const float saved = (*param)[i];
    (*param)[i] = saved + h;
    const double up = loss();
    (*param)[i] = saved - h;
    const double down = loss();
    (*param)[i] = saved;
    grad[i] = static_cast<float>((up - down) / (2 * h));
  }
  return grad;
}

Device* TestGpu() {
  static Device* gpu = [] () -> Device* {
    if (CudaGpuCount() == 0) return nullptr;
    DeviceSpec spec;
    spec.type = DeviceType::kCuda;
    spec.gpu_ids = {0};
    auto devices = CreateDevices(spec);
    if (!devices.ok() || devices->empty()) return nullptr;
    return (*devices)[0].release();  // lives for the whole test binary
  }();
  return gpu;
}

DeviceBuffer::DeviceBuffer(Device* device, absl::Span<const float> values)
    : DeviceBuffer(device, static_cast<int64_t>(values.size())) {
  auto status = device_->CopyHostToDevice(data_, values.data(), n_ * sizeof(float));
  EXPECT_TRUE(status.ok()) << status;
}

DeviceBuffer::DeviceBuffer(Device* device, int64_t n) : device_(device), n_(n) {
  auto ptr = device_->Allocate(n * sizeof(float));
  EXPECT_TRUE(ptr.ok()) << ptr.status();
  data_ = static_cast<float*>(ptr.value_or(nullptr));
  auto status = device_->Memzero(data_, n * sizeof(float));
  EXPECT_TRUE(status.ok()) << status;
}

DeviceBuffer::~DeviceBuffer() { device_->Deallocate(data_); }

std::vector<float> DeviceBuffer::ToHost() const {
  std::vector<float> out(n_);
  auto status = device_->Synchronize();
  EXPECT_TRUE(status.ok()) << status;
  status = device_->CopyDeviceToHost(out.data(), data_, n_ * sizeof(float));
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

}  // namespace ps::kernels::testing
