// Throughput of the GEMM and convolution kernels on CPU devices, in FLOP/s.
//
//   bazel run -c opt //kernels:kernels_benchmark -- --benchmark_repetitions=5
//   (add --benchmark_report_aggregates_only for just the aggregates)
//
// Each benchmark takes the device's thread count and the BLAS thread count
// as its last two arguments: "threads:1/blas:1" is one core; with two device
// threads, blas:1 has the convolution's threads each run whole blocks on a
// single-threaded BLAS, blas:2 has BLAS thread every GEMM (see conv_cpu.h).

#include <algorithm>
#include <cstdint>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/cpu_device.h"
#include "kernels/conv.h"
#include "kernels/gemm.h"
#include "kernels/test_util.h"

namespace ps::kernels {
namespace {

using testing::RandomVector;

void SetFlopCounter(benchmark::State& state, double flops_per_iteration) {
  state.counters["FLOPS"] =
      benchmark::Counter(flops_per_iteration, benchmark::Counter::kIsIterationInvariantRate,
                         benchmark::Counter::kIs1000);
  state.SetLabel(BlasCoreName());
}

// Arguments: m, n, k, device threads, BLAS threads. C = A * B.
void BM_Gemm(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  CpuDevice cpu(0, static_cast<int>(state.range(3)));
  SetBlasThreads(static_cast<int>(state.range(4)));
  const auto a = RandomVector(m * k, 1), b = RandomVector(k * n, 2);
  std::vector<float> c(m * n);
  for (auto _ : state) {
    const absl::Status status =
        Gemm(cpu, false, false, m, n, k, 1.f, a.data(), b.data(), 0.f, c.data());
    if (!status.ok()) state.SkipWithError(status.ToString().c_str());
    benchmark::DoNotOptimize(c.data());
  }
  SetFlopCounter(state, 2.0 * m * n * k);
}

void GemmArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"m", "n", "k", "threads", "blas"});
  const std::vector<std::vector<int64_t>> shapes = {
      {256, 256, 256},
      {1024, 1024, 1024},
      // LeNet's convolutions as one GEMM over batch 256 (weight x columns)...
      {6, 256 * 28 * 28, 25},
      {16, 256 * 10 * 10, 150},
      // ...and as the CPU kernel runs them, one block of samples at a time.
      {6, 8 * 28 * 28, 25},
      {16, 13 * 10 * 10, 150},
      // LeNet's fully connected layers at batch 256 (batch x out x in).
      {256, 120, 400},
      {256, 84, 120},
  };
  for (const auto& s : shapes) {
    b->Args({s[0], s[1], s[2], 1, 1});
    b->Args({s[0], s[1], s[2], 2, 2});
  }
}
// The fastest of several repetitions (--benchmark_repetitions=N) estimates
// the uncontended speed on a shared machine, where the mean and median pick
// up other processes' noise.
double Min(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

BENCHMARK(BM_Gemm)->Apply(GemmArgs)->UseRealTime()->ComputeStatistics("min", Min);

Conv2dShape LeNetConv(int layer) {
  Conv2dShape s;
  s.batch = 256;
  if (layer == 1) {  // 1 -> 6 channels, 5x5, pad 2, on 28x28
    s.in_channels = 1;
    s.height = s.width = 28;
    s.out_channels = 6;
    s.pad_h = s.pad_w = 2;
  } else {  // 6 -> 16 channels, 5x5, on 14x14 (after 2x2 pooling)
    s.in_channels = 6;
    s.height = s.width = 14;
    s.out_channels = 16;
  }
  s.kernel_h = s.kernel_w = 5;
  return s;
}

// One GEMM's worth of multiply-adds: every output pixel of every sample and
// channel takes C * KH * KW of them.
double ConvFlops(const Conv2dShape& s) {
  return 2.0 * s.batch * s.out_channels * s.out_height() * s.out_width() * s.in_channels *
         s.kernel_h * s.kernel_w;
}

// Arguments: layer (1 or 2), device threads, BLAS threads.
void BM_ConvForward(benchmark::State& state) {
  const Conv2dShape s = LeNetConv(static_cast<int>(state.range(0)));
  CpuDevice cpu(0, static_cast<int>(state.range(1)));
  SetBlasThreads(static_cast<int>(state.range(2)));
  const auto x = RandomVector(s.batch * s.in_channels * s.height * s.width, 1);
  const auto w = RandomVector(s.out_channels * s.in_channels * s.kernel_h * s.kernel_w, 2);
  const auto bias = RandomVector(s.out_channels, 3);
  std::vector<float> y(s.batch * s.out_channels * s.out_height() * s.out_width());
  for (auto _ : state) {
    const absl::Status status = Conv2dForward(cpu, s, x.data(), w.data(), bias.data(), y.data());
    if (!status.ok()) state.SkipWithError(status.ToString().c_str());
    benchmark::DoNotOptimize(y.data());
  }
  SetFlopCounter(state, ConvFlops(s));
}

// Arguments: layer, device threads, BLAS threads. Layer 1 is the network's
// input layer, so like a model it skips dx there; layer 2 computes all three
// gradients (twice the forward's FLOPs).
void BM_ConvBackward(benchmark::State& state) {
  const int layer = static_cast<int>(state.range(0));
  const Conv2dShape s = LeNetConv(layer);
  CpuDevice cpu(0, static_cast<int>(state.range(1)));
  SetBlasThreads(static_cast<int>(state.range(2)));
  const auto x = RandomVector(s.batch * s.in_channels * s.height * s.width, 1);
  const auto w = RandomVector(s.out_channels * s.in_channels * s.kernel_h * s.kernel_w, 2);
  const auto dy = RandomVector(s.batch * s.out_channels * s.out_height() * s.out_width(), 3);
  std::vector<float> dx(x.size()), dw(w.size()), db(s.out_channels);
  float* dx_or_null = layer == 1 ? nullptr : dx.data();
  for (auto _ : state) {
    const absl::Status status =
        Conv2dBackward(cpu, s, x.data(), w.data(), dy.data(), dx_or_null, dw.data(), db.data());
    if (!status.ok()) state.SkipWithError(status.ToString().c_str());
    benchmark::DoNotOptimize(dw.data());
  }
  SetFlopCounter(state, ConvFlops(s) * (layer == 1 ? 1 : 2));
}

void ConvArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"layer", "threads", "blas"});
  for (int layer : {1, 2}) {
    b->Args({layer, 1, 1});
    b->Args({layer, 2, 1});
    b->Args({layer, 2, 2});
  }
}
BENCHMARK(BM_ConvForward)->Apply(ConvArgs)->UseRealTime()->ComputeStatistics("min", Min);
BENCHMARK(BM_ConvBackward)->Apply(ConvArgs)->UseRealTime()->ComputeStatistics("min", Min);

}  // namespace
}  // namespace ps::kernels
