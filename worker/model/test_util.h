#ifndef PS_WORKER_MODEL_TEST_UTIL_H_
#define PS_WORKER_MODEL_TEST_UTIL_H_

// Helpers for the layer and model tests: host<->device tensors, and the
// comparison of analytic gradients with central finite differences.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "common/device.h"
#include "common/tensor.h"
#include "gtest/gtest.h"

namespace ps::worker::model::testing {

// n uniform values in [lo, hi), deterministic in `seed`.
std::vector<float> Uniform(int64_t n, uint64_t seed, float lo = -1.f, float hi = 1.f);

// An F32 tensor on `device` holding `values`; aborts on error.
Tensor DeviceTensor(Device* device, const Shape& shape, absl::Span<const float> values);
// An I32 tensor on `device` holding `labels`.
Tensor DeviceLabels(Device* device, absl::Span<const int32_t> labels);
// The elements of an F32 tensor, after synchronising its device.
std::vector<float> HostValues(const Tensor& t);
// One float at `ptr` in `device` memory, after synchronising the device.
float ReadDeviceFloat(Device* device, const float* ptr);

// Passes when every |analytic[i] - numeric[i]| <= atol + rtol * max(|a|, |n|);
// otherwise names `what`, the worst element and both values.
::testing::AssertionResult GradientsClose(const std::string& what,
                                          absl::Span<const double> analytic,
                                          absl::Span<const double> numeric, double rtol,
                                          double atol);

}  // namespace ps::worker::model::testing

#endif  // PS_WORKER_MODEL_TEST_UTIL_H_
