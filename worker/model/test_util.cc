#include "worker/model/test_util.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>

namespace ps::worker::model::testing {
namespace {

// Test set-up failures are programming errors of the test: stop loudly.
void OrDie(const absl::Status& status) {
  if (!status.ok()) {
    std::fprintf(stderr, "test helper failed: %s\n", status.ToString().c_str());
    std::abort();
  }
}

}  // namespace

std::vector<float> Uniform(int64_t n, uint64_t seed, float lo, float hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

Tensor DeviceTensor(Device* device, const Shape& shape, absl::Span<const float> values) {
  absl::StatusOr<Tensor> t = Tensor::FromHost(device, shape, values);
  OrDie(t.status());
  return *std::move(t);
}

Tensor DeviceLabels(Device* device, absl::Span<const int32_t> labels) {
  const int64_t n = static_cast<int64_t>(labels.size());
  absl::StatusOr<Tensor> t = Tensor::Empty(device, {n}, DType::kI32);
  OrDie(t.status());
  absl::Status s = device->CopyHostToDevice(t->mutable_raw_data(), labels.data(), n * 4);
  OrDie(s);
  return *std::move(t);
}

std::vector<float> HostValues(const Tensor& t) {
  absl::Status s = t.device()->Synchronize();
  OrDie(s);
  absl::StatusOr<std::vector<float>> v = t.ToVector();
  OrDie(v.status());
  return *std::move(v);
}

float ReadDeviceFloat(Device* device, const float* ptr) {
  absl::Status s = device->Synchronize();
  OrDie(s);
  float v = 0;
  s = device->CopyDeviceToHost(&v, ptr, sizeof(float));
  OrDie(s);
  return v;
}

::testing::AssertionResult GradientsClose(const std::string& what,
                                          absl::Span<const double> analytic,
                                          absl::Span<const double> numeric, double rtol,
                                          double atol) {
  if (analytic.size() != numeric.size()) {
    return ::testing::AssertionFailure() << what << ": " << analytic.size() << " analytic vs "
                                         << numeric.size() << " numeric values";
  }
  int64_t worst = -1;
  double worst_excess = 0, max_err = 0;
  for (size_t i = 0; i < analytic.size(); ++i) {
    const double err = std::fabs(analytic[i] - numeric[i]);
    const double tol = atol + rtol * std::max(std::fabs(analytic[i]), std::fabs(numeric[i]));
    max_err = std::max(max_err, err);
    if (!(err <= tol) && err - tol >= worst_excess) {
      worst_excess = err - tol;
      worst = static_cast<int64_t>(i);
    }
  }
  if (worst >= 0) {
    return ::testing::AssertionFailure()
           << what << ": element " << worst << " analytic " << analytic[worst] << " vs numeric "
           << numeric[worst] << " (rtol " << rtol << ", atol " << atol << "); max abs error "
           << max_err << " over " << analytic.size() << " values";
  }
  return ::testing::AssertionSuccess() << what << ": max abs error " << max_err;
}

}  // namespace ps::worker::model::testing
