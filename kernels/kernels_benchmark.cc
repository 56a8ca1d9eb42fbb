// Throughput of the GEMM and convolution kernels on CPU devices, in FLOP/s.
//
//   bazel run -c opt //kernels:kernels_benchmark -- --benchmark_repetitions=5
//   (add --benchmark_report_aggregates_only for just the aggregates)
//
// Each benchmark takes the device's thread count and the GEMM thread count
// (SetBlasThreads) as its last two arguments: "threads:1/blas:1" is one
// core. With two device threads the convolution's threads each run whole
// blocks of samples, their GEMMs single-threaded (see conv_cpu.h). GEMM
// alone with blas:2 is oneDNN's threading over two OpenMP threads.

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
}

// Arguments: m, n, k, trans_a, trans_b, device threads, BLAS threads.
// C = op(A) * op(B).
void BM_Gemm(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const bool trans_a = state.range(3) != 0, trans_b = state.range(4) != 0;
  CpuDevice cpu(0, static_cast<int>(state.range(5)));
  SetBlasThreads(static_cast<int>(state.range(6)));
  const auto a = RandomVector(m * k, 1), b = RandomVector(k * n, 2);
  std::vector<float> c(m * n);
  for (auto _ : state) {
    const absl::Status status =
        Gemm(cpu, trans_a, trans_b, m, n, k, 1.f, a.data(), b.data(), 0.f, c.data());
    if (!status.ok()) state.SkipWithError(status.ToString().c_str());
    benchmark::DoNotOptimize(c.data());
  }
  SetFlopCounter(state, 2.0 * m * n * k);
}

void GemmArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"m", "n", "k", "ta", "tb", "threads", "blas"});
  const std::vector<std::vector<int64_t>> shapes = {
      {256, 256, 256, 0, 0},
      {1024, 1024, 1024, 0, 0},
      // LeNet's convolutions as one GEMM over batch 256 (weight x columns)...
      {6, 256 * 28 * 28, 25, 0, 0},
      {16, 256 * 10 * 10, 150, 0, 0},
      // ...and as the CPU kernel runs them, one block of samples (2 for
      // conv1, 3 for conv2) at a time: forward, dx's columns, dweight (for
      // conv2 as its transpose, see conv_cpu.cc).
      {6, 2 * 28 * 28, 25, 0, 0},
      {6, 25, 2 * 28 * 28, 0, 1},
      {16, 3 * 10 * 10, 150, 0, 0},
      {150, 3 * 10 * 10, 16, 1, 0},
      {150, 16, 3 * 10 * 10, 0, 1},
      // LeNet's fully connected layers at batch 256 (batch x out x in).
      {256, 120, 400, 0, 1},
      {256, 84, 120, 0, 1},
      // MLP-20M (784-4096-4096-10) at batch 128: forward, dx, dweight.
      {128, 4096, 784, 0, 1},
      {128, 4096, 4096, 0, 1},
      {128, 4096, 4096, 0, 0},
      {4096, 4096, 128, 1, 0},
      // ... and one of the blocks of 512 output features the Linear layer
      // computes them in with --linear_block_rows=512: forward, dweight.
      {128, 512, 4096, 0, 1},
      {512, 4096, 128, 1, 0},
      // A ResNet-18 stage-1 convolution, one sample as im2col's GEMM.
      {64, 784, 576, 0, 0},
  };
  for (const auto& s : shapes) {
    b->Args({s[0], s[1], s[2], s[3], s[4], 1, 1});
    b->Args({s[0], s[1], s[2], s[3], s[4], 2, 2});
  }
}

// With --benchmark_repetitions=N, "min" and "max" rows besides the mean,
// median and stddev: on a shared machine the fastest repetition estimates
// the uncontended speed. Each statistic applies to every column, so read the
// time from the _min row and the FLOP/s from the _max row.
double Min(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }
double Max(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }

BENCHMARK(BM_Gemm)
    ->Apply(GemmArgs)
    ->UseRealTime()
    ->ComputeStatistics("min", Min)
    ->ComputeStatistics("max", Max);

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

// Both of LeNet's convolutions, forward and backward, as one training step
// at batch 256 runs them. Arguments: device threads, BLAS threads.
void BM_LeNetConvStep(benchmark::State& state) {
  CpuDevice cpu(0, static_cast<int>(state.range(0)));
  SetBlasThreads(static_cast<int>(state.range(1)));
  const Conv2dShape s1 = LeNetConv(1), s2 = LeNetConv(2);
  const auto x1 = RandomVector(s1.batch * 28 * 28, 1);
  const auto w1 = RandomVector(6 * 25, 2), b1 = RandomVector(6, 3);
  const auto x2 = RandomVector(s2.batch * 6 * 14 * 14, 4);
  const auto w2 = RandomVector(16 * 6 * 25, 5), b2 = RandomVector(16, 6);
  std::vector<float> y1(s1.batch * 6 * 28 * 28), y2(s2.batch * 16 * 10 * 10);
  std::vector<float> dw1(w1.size()), db1(6), dx2(x2.size()), dw2(w2.size()), db2(16);
  for (auto _ : state) {
    absl::Status status = Conv2dForward(cpu, s1, x1.data(), w1.data(), b1.data(), y1.data());
    if (status.ok()) status = Conv2dForward(cpu, s2, x2.data(), w2.data(), b2.data(), y2.data());
    // The step's dy are stand-ins of the right sizes: the outputs themselves.
    if (status.ok()) {
      status = Conv2dBackward(cpu, s2, x2.data(), w2.data(), y2.data(), dx2.data(), dw2.data(),
                              db2.data());
    }
    if (status.ok()) {
      status =
          Conv2dBackward(cpu, s1, x1.data(), w1.data(), y1.data(), nullptr, dw1.data(), db1.data());
    }
    if (!status.ok()) state.SkipWithError(status.ToString().c_str());
    benchmark::DoNotOptimize(dw1.data());
  }
  SetFlopCounter(state, 2 * ConvFlops(s1) + 3 * ConvFlops(s2));
}
BENCHMARK(BM_LeNetConvStep)
    ->ArgNames({"threads", "blas"})
    ->Args({1, 1})
    ->Args({2, 1})
    ->Args({2, 2})
    ->UseRealTime()
    ->ComputeStatistics("min", Min)
    ->ComputeStatistics("max", Max);

void ConvArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"layer", "threads", "blas"});
  for (int layer : {1, 2}) {
    b->Args({layer, 1, 1});
    b->Args({layer, 2, 1});
    b->Args({layer, 2, 2});
  }
}
BENCHMARK(BM_ConvForward)
    ->Apply(ConvArgs)
    ->UseRealTime()
    ->ComputeStatistics("min", Min)
    ->ComputeStatistics("max", Max);
BENCHMARK(BM_ConvBackward)
    ->Apply(ConvArgs)
    ->UseRealTime()
    ->ComputeStatistics("min", Min)
    ->ComputeStatistics("max", Max);

}  // namespace
}  // namespace ps::kernels
