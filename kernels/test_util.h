#ifndef PS_KERNELS_TEST_UTIL_H_
#define PS_KERNELS_TEST_UTIL_H_

// Helpers for kernel tests: random inputs, closeness checks that print the
// worst element, and access to a GPU when one is present.

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/types/span.h"
#include "common/devices.h"
#include "gtest/gtest.h"

namespace ps::kernels::testing {

// n uniform values in [lo, hi), deterministic in `seed`.
std::vector<float> RandomVector(int64_t n, uint64_t seed, float lo = -1.f, float hi = 1.f);

// Passes when |actual[i] - expected[i]| <= atol + rtol * |expected[i]| for all
// i; otherwise names the worst index, both values and the max errors.
::testing::AssertionResult AllClose(absl::Span<const float> actual,
                                    absl::Span<const float> expected, float atol, float rtol);

// Central differences: element i of the result is
// (loss() at param[i] + h - loss() at param[i] - h) / 2h. Each element of
// *param is perturbed in place and restored before the next.
std::vector<float> NumericGradient(std::vector<float>* param, float h,
                                   const std::function<double()>& loss);

// The first CUDA device of this process, created on first use; nullptr when
// the build has no CUDA or no GPU is usable. Shared by the tests of one binary.
Device* TestGpu();

// A device buffer holding `values` (copied from host), freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer(Device* device, absl::Span<const float> values);
  DeviceBuffer(Device* device, int64_t n);  // zero-filled
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  float* data() { return data_; }
  int64_t size() const { return n_; }
  std::vector<float> ToHost() const;  // synchronises the device first

 private:
  Device* device_;
  float* data_ = nullptr;
  int64_t n_;
};

}  // namespace ps::kernels::testing

// Skips the current test, with a message saying why, when no GPU is usable.
#define PS_SKIP_WITHOUT_GPU()                                                    \
  do {                                                                           \
    if (::ps::kernels::testing::TestGpu() == nullptr) {                          \
      GTEST_SKIP() << "no usable CUDA GPU (no driver, no device, or a "          \
                      "--config=cpu_only build): GPU-vs-CPU check skipped";      \
    }                                                                            \
  } while (false)

#endif  // PS_KERNELS_TEST_UTIL_H_
