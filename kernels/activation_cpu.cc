#include "kernels/activation_cpu.h"

#include <cmath>

namespace ps::kernels::internal {
namespace {

// Below this many elements a loop stays on one thread: waking the pool costs
// more than the work.
constexpr int64_t kMinChunk = 1 << 15;

// Written as "x < 0 ? 0 : x" rather than std::max so that NaN propagates, as
// in torch.relu.
inline float Relu(float x) { return x < 0.f ? 0.f : x; }

// exp() only ever sees a non-positive argument, so it cannot overflow: for
// x >= 0, 1 / (1 + e^-x); for x < 0, e^x / (1 + e^x). Both tend to the right
// limit (1 and 0) as |x| grows.
inline float Sigmoid(float x) {
  if (x >= 0.f) return 1.f / (1.f + std::exp(-x));
  const float e = std::exp(x);
  return e / (1.f + e);
}

}  // namespace

void ReluForwardCpu(CpuDevice& device, int64_t n, const float* x, float* y) {
  device.ParallelFor(n, kMinChunk, [=](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) y[i] = Relu(x[i]);
  });
}

void ReluBackwardCpu(CpuDevice& device, int64_t n, const float* y, const float* dy, float* dx) {
  device.ParallelFor(n, kMinChunk, [=](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) dx[i] = y[i] > 0.f ? dy[i] : 0.f;
  });
}

void SigmoidForwardCpu(CpuDevice& device, int64_t n, const float* x, float* y) {
  device.ParallelFor(n, kMinChunk, [=](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) y[i] = Sigmoid(x[i]);
  });
}

void SigmoidBackwardCpu(CpuDevice& device, int64_t n, const float* y, const float* dy, float* dx) {
  device.ParallelFor(n, kMinChunk, [=](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) dx[i] = dy[i] * y[i] * (1.f - y[i]);
  });
}

}  // namespace ps::kernels::internal
