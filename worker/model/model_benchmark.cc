// One model's ForwardBackward on a CPU device, step by step, reporting the
// fastest and the median step in wall time and in the calling thread's CPU
// time. The minimum and the thread CPU time hold up on a shared machine,
// where the trainer benchmark's mean wall time does not.
//
//   bazel run -c opt //worker/model:model_benchmark -- --model=lenet --threads=1
//   bazel run -c opt //worker/model:model_benchmark -- --model=resnet18_cifar --batch=64 --steps=5

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "common/cpu_device.h"
#include "kernels/gemm.h"
#include "worker/model/model.h"

ABSL_FLAG(std::string, model, "lenet", "model name");
ABSL_FLAG(int64_t, batch, 256, "batch size");
ABSL_FLAG(int, threads, 1, "device threads (and BLAS threads)");
ABSL_FLAG(int, steps, 60, "measured steps (after 5 warm-up steps)");

namespace {

double ThreadCpuMs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int threads = absl::GetFlag(FLAGS_threads);
  const int64_t batch = absl::GetFlag(FLAGS_batch);
  ps::CpuDevice device(0, threads);
  ps::kernels::SetBlasThreads(threads);
  ps::worker::model::ModelConfig config;
  config.name = absl::GetFlag(FLAGS_model);
  auto model = ps::worker::model::Model::Create(config, &device);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
    return 1;
  }
  if (auto st = (*model)->Initialize(1); !st.ok()) return 1;
  ps::Shape shape = {batch};
  shape.insert(shape.end(), config.input_shape.begin(), config.input_shape.end());
  std::vector<float> x(ps::NumElements(shape));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 7919) % 255) / 255.f;
  std::vector<int32_t> y(batch);
  for (int64_t i = 0; i < batch; ++i) y[i] = static_cast<int32_t>(i % config.num_classes);
  auto inputs = ps::Tensor::FromHost(&device, shape, x);
  auto labels = ps::Tensor::Empty(&device, {batch}, ps::DType::kI32);
  if (!inputs.ok() || !labels.ok()) return 1;
  std::memcpy(labels->mutable_raw_data(), y.data(), y.size() * sizeof(int32_t));
  std::vector<double> wall, cpu;
  const int steps = absl::GetFlag(FLAGS_steps);
  for (int s = 0; s < steps + 5; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = ThreadCpuMs();
    auto metrics = (*model)->ForwardBackward(*inputs, *labels);
    if (!metrics.ok()) {
      std::fprintf(stderr, "%s\n", metrics.status().ToString().c_str());
      return 1;
    }
    const double c1 = ThreadCpuMs();
    const auto t1 = std::chrono::steady_clock::now();
    if (s < 5) continue;
    wall.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    cpu.push_back(c1 - c0);
  }
  std::sort(wall.begin(), wall.end());
  std::sort(cpu.begin(), cpu.end());
  std::printf("%s batch %lld threads %d: wall ms min %.2f median %.2f (%.0f samples/s at min); "
              "thread cpu ms min %.2f median %.2f\n",
              config.name.c_str(), static_cast<long long>(batch), threads, wall[0],
              wall[wall.size() / 2], batch / wall[0] * 1e3, cpu[0], cpu[cpu.size() / 2]);
  return 0;
}
