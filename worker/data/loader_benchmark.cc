// Throughput of the per-step data path: bazel run -c opt //worker/data:loader_benchmark

#include <cstdint>
#include <vector>

#include "benchmark/benchmark.h"
#include "worker/data/loader.h"
#include "worker/data/synthetic.h"

namespace ps::worker::data {
namespace {

// One batch of `batch` samples gathered and normalised; range(1) picks the
// shape: 0 = [1, 28, 28] (Fashion-MNIST), 1 = [3, 32, 32] (CIFAR-10).
void BM_GatherBatch(benchmark::State& state) {
  const int64_t batch = state.range(0);
  SyntheticOptions options;
  options.sample_shape = state.range(1) == 0 ? Shape{1, 28, 28} : Shape{3, 32, 32};
  options.size = 4096;
  const Dataset dataset = *MakeSyntheticDataset(options);
  Normalization normalization;
  normalization.mean.assign(options.sample_shape[0], 0.5f);
  normalization.std.assign(options.sample_shape[0], 0.25f);
  const std::vector<int64_t> order = EpochOrder(dataset.size(), 1, 0, true);
  std::vector<float> images(batch * dataset.sample_elements());
  std::vector<int32_t> labels(batch);
  int64_t start = 0;
  for (auto _ : state) {
    if (start + batch > dataset.size()) start = 0;
    absl::Span<const int64_t> indices(order.data() + start, batch);
    benchmark::DoNotOptimize(GatherBatch(dataset, indices, normalization, absl::MakeSpan(images),
                                         absl::MakeSpan(labels)));
    start += batch;
  }
  state.SetBytesProcessed(state.iterations() * batch * dataset.sample_elements());
}
BENCHMARK(BM_GatherBatch)->Args({256, 0})->Args({256, 1});

void BM_EpochOrder(benchmark::State& state) {
  int64_t epoch = 0;
  for (auto _ : state) benchmark::DoNotOptimize(EpochOrder(state.range(0), 1, epoch++, true));
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_EpochOrder)->Arg(60000);

void BM_MakeSynthetic(benchmark::State& state) {
  SyntheticOptions options;
  options.size = state.range(0);
  for (auto _ : state) benchmark::DoNotOptimize(MakeSyntheticDataset(options));
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_MakeSynthetic)->Arg(8192);

}  // namespace
}  // namespace ps::worker::data
