// Training throughput on CPU devices at one global batch: one device with 1
// and with 2 threads, and D = 2 devices of 1 thread each, with the step time
// split into its phases. Prints figures; not a test (tagged "benchmark").
//
//   bazel run //worker:trainer_benchmark
//   bazel run //worker:trainer_benchmark -- --steps=100 --models=lenet
//   bazel run //worker:trainer_benchmark -- --models=resnet18 --batch_size=64 --steps=10
//   bazel run //worker:trainer_benchmark -- --precisions=fp32,bf16   (side by side)
//   bash deploy/dev/bench/resnet_compare.sh   (resnet18_cifar against PyTorch, in rounds)

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "common/cpu_device.h"
#include "common/precision.h"
#include "common/process_tuning.h"
#include "kernels/gemm.h"
#include "worker/data/synthetic.h"
#include "worker/local_parameter_store.h"
#include "worker/trainer.h"

ABSL_FLAG(int64_t, steps, 40, "measured steps per configuration (after 5 warm-up steps)");
ABSL_FLAG(int64_t, batch_size, 256, "global batch");
ABSL_FLAG(std::string, models, "lenet,mlp",
          "models to measure (mlp: 784-1024-1024-10; resnet18, resnet18_cifar: D2L's, on 28x28 "
          "input)");
ABSL_FLAG(int, blas_threads, 0,
          "GEMM threads (SetBlasThreads); 0: the device's thread count (as the worker sets it)");
ABSL_FLAG(std::string, precisions, "fp32",
          "GEMM precisions to measure each configuration in (fp32, bf16, fp16), side by side");
ABSL_FLAG(std::string, configs, "1x1,1x2,2x1",
          "devices x threads per device to measure, e.g. 1x1,1x2 (1 device of 1 thread, then "
          "1 device of 2 threads)");

namespace ps::worker {
namespace {

struct Config {
  const char* label;
  int devices;
  int threads_per_device;
};

absl::Status Measure(const std::string& model_name, const Config& c, Precision precision,
                     const data::Dataset& data, int64_t batch, int64_t steps) {
  std::vector<std::unique_ptr<CpuDevice>> owned;
  std::vector<Device*> devices;
  for (int d = 0; d < c.devices; ++d) {
    owned.push_back(std::make_unique<CpuDevice>(d, c.threads_per_device));
    devices.push_back(owned.back().get());
  }
  const int blas = absl::GetFlag(FLAGS_blas_threads);
  kernels::SetBlasThreads(blas > 0 ? blas : c.threads_per_device);
  OptimizerOptions sgd;
  sgd.sgd.lr = 0.1f;
  sgd.sgd.momentum = 0.9f;
  auto store = LocalParameterStore::Create(sgd);
  if (!store.ok()) return store.status();
  TrainerOptions options;
  options.batch_size = batch;
  options.epochs = 1;
  options.evaluate = false;
  options.precision = precision;
  model::ModelConfig model;
  model.name = model_name;
  model.mlp_hidden = {1024, 1024};
  auto trainer = Trainer::Create(options, model, devices, store->get(), &data, nullptr);
  if (!trainer.ok()) return trainer.status();
  for (int64_t s = 0; s < 5; ++s) {
    if (absl::Status st = (*trainer)->TrainStep(0, s); !st.ok()) return st;
  }
  (*trainer)->ResetTimeSplit();
  const auto start = std::chrono::steady_clock::now();
  for (int64_t s = 5; s < 5 + steps; ++s) {
    if (absl::Status st = (*trainer)->TrainStep(0, s); !st.ok()) return st;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const TimeSplit& t = (*trainer)->time_split();
  const double ms = 1e3 / steps;
  std::printf("%-14s %-22s %-5s %9.2f %11.0f %8.2f %8.2f %8.2f %8.2f %8.2f\n",
              model_name.c_str(), c.label, std::string(PrecisionName(precision)).c_str(), 1e3 * seconds / steps, batch * steps / seconds, t.data * ms,
              t.compute * ms, t.reduce * ms, t.copy * ms, (t.push + t.wait + t.pull) * ms);
  return absl::OkStatus();
}

int Run() {
  const int64_t steps = absl::GetFlag(FLAGS_steps);
  const int64_t batch = absl::GetFlag(FLAGS_batch_size);
  data::SyntheticOptions data_options;
  data_options.size = batch * (steps + 5);
  auto data = data::MakeSyntheticDataset(data_options);
  if (!data.ok()) {
    std::fprintf(stderr, "%s\n", data.status().ToString().c_str());
    return 1;
  }
  std::vector<Config> configs;
  for (absl::string_view spec : absl::StrSplit(absl::GetFlag(FLAGS_configs), ',')) {
    const Config known[] = {{"1 device x 1 thread", 1, 1},
                            {"1 device x 2 threads", 1, 2},
                            {"2 devices x 1 thread", 2, 1}};
    const char* names[] = {"1x1", "1x2", "2x1"};
    bool found = false;
    for (int i = 0; i < 3; ++i) {
      if (spec == names[i]) {
        configs.push_back(known[i]);
        found = true;
      }
    }
    if (!found) {
      std::fprintf(stderr, "--configs: unknown \"%s\"; known: 1x1, 1x2, 2x1\n",
                   std::string(spec).c_str());
      return 1;
    }
  }
  std::printf("global batch %lld, %lld measured steps\n", static_cast<long long>(batch),
              static_cast<long long>(steps));
  std::printf("times per step in ms; store = push + wait + pull (in process here)\n");
  std::vector<Precision> precisions;
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_precisions), ',')) {
    absl::StatusOr<Precision> precision = ParsePrecision(name);
    if (!precision.ok()) {
      std::fprintf(stderr, "--precisions: %s\n", precision.status().ToString().c_str());
      return 1;
    }
    precisions.push_back(*precision);
  }
  std::printf("%-14s %-22s %-5s %9s %11s %8s %8s %8s %8s %8s\n", "model", "devices", "gemm",
              "step ms",
              "samples/s", "data", "compute", "reduce", "copy", "store");
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_models), ',')) {
    for (const Config& c : configs) {
      for (Precision precision : precisions) {
        if (absl::Status s = Measure(std::string(name), c, precision, *data, batch, steps);
            !s.ok()) {
          std::fprintf(stderr, "%s\n", s.ToString().c_str());
          return 1;
        }
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace ps::worker

int main(int argc, char** argv) {
  // As the worker daemon does: large blocks from the heap, not fresh mmaps.
  ps::TuneMallocForLargeMessages();
  ps::DisableMutexDeadlockDetection();
  absl::ParseCommandLine(argc, argv);
  return ps::worker::Run();
}
