#include "kernels/elementwise_cpu.h"

namespace ps::kernels::internal {
namespace {
// Below this many elements a loop stays on one thread: waking the pool costs
// more than the work.
constexpr int64_t kMinChunk = 1 << 15;
}  // namespace

void FillCpu(CpuDevice& device, int64_t n, float value, float* y) {
  device.ParallelFor(n, kMinChunk, [=](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) y[i] = value;
  });
}

void ScaleCpu(CpuDevice& device, int64_t n, float alpha, float* y) {
  device.ParallelFor(n, kMinChunk, [=](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) y[i] *= alpha;
  });
}

void AxpyCpu(CpuDevice& device, int64_t n, float alpha, const float* x, float* y) {
  device.ParallelFor(n, kMinChunk, [=](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) y[i] += alpha * x[i];
  });
}

void AddCpu(CpuDevice& device, int64_t n, const float* a, const float* b, float* out) {
  device.ParallelFor(n, kMinChunk, [=](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) out[i] = a[i] + b[i];
  });
}

}  // namespace ps::kernels::internal
