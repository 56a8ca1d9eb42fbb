// ResNet-18's convolutions (D2L's, on 28x28 Fashion-MNIST input; layers 0-10
// "resnet18", 11-21 "resnet18_cifar", whose 3x3/1 stem keeps stage 1 at
// 28x28) one layer shape at a time: conv_cpu.cc's im2col + OpenBLAS against oneDNN's
// primitives on NCHW as stored (plain) and in oneDNN's blocked layouts with
// the reorders in and out counted, forward, backward-weights alone (dx
// skipped, as for a first layer) and the whole backward (data + weights).
// What PreferDnnlConv chooses comes from these figures.
//
//   bazel run -c opt //kernels:conv_benchmark -- --benchmark_min_time=0.2
//   ... -- --benchmark_filter='layer:(1[1-9]|2[01])/batch:64/threads:1'   (resnet18_cifar)
//
// Arguments: layer (index into kLayers), batch, device threads, impl (0 ours,
// 1 oneDNN plain, 2 oneDNN blocked, 3 oneDNN Winograd where it applies). BLAS runs on one thread when the device
// has one, else on the device's threads (as the worker sets it).

#include <cstdint>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/cpu_device.h"
#include "kernels/conv.h"
#include "kernels/conv_cpu.h"
#include "kernels/conv_dnnl.h"
#include "kernels/gemm.h"
#include "kernels/test_util.h"

namespace ps::kernels {
namespace {

using internal::DnnlMethod;
using testing::RandomVector;

struct Layer {
  int64_t c, hw, o, k, stride, pad;
};

// in channels, input size, out channels, kernel, stride, pad.
const Layer kLayers[] = {
    {1, 28, 64, 7, 2, 3},      // 0: b1.conv
    {64, 7, 64, 3, 1, 1},      // 1: stage1 (x4)
    {64, 7, 128, 3, 2, 1},     // 2: stage2.block0.conv1
    {128, 4, 128, 3, 1, 1},    // 3: stage2 (x3)
    {64, 7, 128, 1, 2, 0},     // 4: stage2.block0.conv3
    {128, 4, 256, 3, 2, 1},    // 5: stage3.block0.conv1
    {256, 2, 256, 3, 1, 1},    // 6: stage3 (x3)
    {128, 4, 256, 1, 2, 0},    // 7: stage3.block0.conv3
    {256, 2, 512, 3, 2, 1},    // 8: stage4.block0.conv1
    {512, 1, 512, 3, 1, 1},    // 9: stage4 (x3)
    {256, 2, 512, 1, 2, 0},    // 10: stage4.block0.conv3
    {1, 28, 64, 3, 1, 1},      // 11: resnet18_cifar b1.conv
    {64, 28, 64, 3, 1, 1},     // 12: stage1 (x4)
    {64, 28, 128, 3, 2, 1},    // 13: stage2.block0.conv1
    {128, 14, 128, 3, 1, 1},   // 14: stage2 (x3)
    {64, 28, 128, 1, 2, 0},    // 15: stage2.block0.conv3
    {128, 14, 256, 3, 2, 1},   // 16: stage3.block0.conv1
    {256, 7, 256, 3, 1, 1},    // 17: stage3 (x3)
    {128, 14, 256, 1, 2, 0},   // 18: stage3.block0.conv3
    {256, 7, 512, 3, 2, 1},    // 19: stage4.block0.conv1
    {512, 4, 512, 3, 1, 1},    // 20: stage4 (x3)
    {256, 7, 512, 1, 2, 0},    // 21: stage4.block0.conv3
};

Conv2dShape ShapeOf(int layer, int64_t batch) {
  const Layer& l = kLayers[layer];
  Conv2dShape s;
  s.batch = batch;
  s.in_channels = l.c;
  s.height = s.width = l.hw;
  s.out_channels = l.o;
  s.kernel_h = s.kernel_w = l.k;
  s.stride_h = s.stride_w = l.stride;
  s.pad_h = s.pad_w = l.pad;
  return s;
}

double Flops(const Conv2dShape& s) {
  return 2.0 * s.batch * s.out_channels * s.out_height() * s.out_width() * s.in_channels *
         s.kernel_h * s.kernel_w;
}

enum class Pass { kForward, kBackwardWeights, kBackward };

void Run(benchmark::State& state, Pass pass) {
  const Conv2dShape s = ShapeOf(static_cast<int>(state.range(0)), state.range(1));
  const int threads = static_cast<int>(state.range(2));
  const int impl = static_cast<int>(state.range(3));
  CpuDevice cpu(0, threads);
  SetBlasThreads(threads);
  const auto x = RandomVector(s.batch * s.in_channels * s.height * s.width, 1);
  const auto w = RandomVector(s.out_channels * s.in_channels * s.kernel_h * s.kernel_w, 2);
  const auto b = RandomVector(s.out_channels, 3);
  const auto dy = RandomVector(s.batch * s.out_channels * s.out_height() * s.out_width(), 4);
  std::vector<float> y(dy.size()), dx(x.size()), dw(w.size()), db(b.size());
  const DnnlMethod method = impl == 3   ? DnnlMethod::kWinograd
                           : impl == 2 ? DnnlMethod::kBlocked
                                       : DnnlMethod::kPlain;
  if (impl == 3 && !internal::WinogradApplies(s)) {
    state.SkipWithError("Winograd does not apply to this shape");
    return;
  }
  for (auto _ : state) {
    absl::Status status;
    float* dx_or_null = pass == Pass::kBackward ? dx.data() : nullptr;
    if (pass == Pass::kForward) {
      status = impl == 0 ? internal::Conv2dForwardCpu(cpu, s, x.data(), w.data(), b.data(),
                                                      y.data())
                         : internal::Conv2dForwardDnnl(cpu, s, method, x.data(), w.data(),
                                                       b.data(), y.data());
    } else {
      status = impl == 0 ? internal::Conv2dBackwardCpu(cpu, s, x.data(), w.data(), dy.data(),
                                                       dx_or_null, dw.data(), db.data())
                         : internal::Conv2dBackwardDnnl(cpu, s, method, x.data(), w.data(),
                                                        dy.data(), dx_or_null, dw.data(),
                                                        db.data());
    }
    if (!status.ok()) state.SkipWithError(status.ToString().c_str());
    benchmark::DoNotOptimize(dw.data());
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["FLOPS"] = benchmark::Counter(
      Flops(s) * (pass == Pass::kBackward ? 2 : 1), benchmark::Counter::kIsIterationInvariantRate,
      benchmark::Counter::kIs1000);
}

void BM_Forward(benchmark::State& state) { Run(state, Pass::kForward); }
void BM_BackwardWeights(benchmark::State& state) { Run(state, Pass::kBackwardWeights); }
void BM_Backward(benchmark::State& state) { Run(state, Pass::kBackward); }

// Ours and oneDNN's next to each other for every shape, batch and thread
// count, so that they share the machine's load of the moment.
void Args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"layer", "batch", "threads", "impl"});
  for (int64_t batch : {64, 256}) {
    for (int threads : {1, 2}) {
      for (int layer = 0; layer < static_cast<int>(std::size(kLayers)); ++layer) {
        for (int impl : {0, 1, 2, 3}) b->Args({layer, batch, threads, impl});
      }
    }
  }
}

BENCHMARK(BM_Forward)->Apply(Args)->UseRealTime();
BENCHMARK(BM_BackwardWeights)->Apply(Args)->UseRealTime();
BENCHMARK(BM_Backward)->Apply(Args)->UseRealTime();

}  // namespace
}  // namespace ps::kernels
