// Training on CUDA devices against training on one CPU device: the same
// initialisation (Model::Initialize is deterministic on every device), the
// same batches, so the same parameters up to float rounding. Covers the data
// parallel path on logical devices that share one GPU (own streams, reduced
// and broadcast by the CUDA collective) and, with two GPUs, across GPUs.
// Skips without a usable GPU.

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/devices.h"
#include "gtest/gtest.h"
#include "worker/data/synthetic.h"
#include "worker/local_parameter_store.h"
#include "worker/trainer_test_util.h"
#include "worker/trainer.h"

namespace ps::worker {
namespace {

#define PS_SKIP_WITHOUT_CUDA_GPU()                                                        \
  do {                                                                                    \
    if (::ps::CudaGpuCount() == 0) {                                                      \
      GTEST_SKIP() << "no usable CUDA GPU: no driver, no device, or a --config=cpu_only " \
                      "build; GPU training is not compared with CPU training";            \
    }                                                                                     \
  } while (false)

using testing::MomentumSgd;
using testing::SyntheticDataset;

struct Trained {
  std::vector<float> parameters;
  TrainingReport report;
};

// Trains `steps` steps of `model_name` on the devices `devices_text` names
// (--devices syntax; CPU devices get one thread each) and returns the final
// parameters of replica 0. Fails the test and returns empty parameters on
// any error.
Trained Train(const std::string& model_name, const std::string& devices_text, int64_t batch,
              int64_t steps, const data::Dataset& data, bool overlap = true) {
  Trained out;
  auto spec = ParseDeviceSpec(devices_text);
  if (!spec.ok()) {
    ADD_FAILURE() << spec.status();
    return out;
  }
  auto owned = CreateDevices(*spec, /*cpu_threads=*/spec->count);
  if (!owned.ok()) {
    ADD_FAILURE() << devices_text << ": " << owned.status();
    return out;
  }
  std::vector<Device*> devices;
  for (auto& d : *owned) devices.push_back(d.get());
  auto store = LocalParameterStore::Create(MomentumSgd());
  if (!store.ok()) {
    ADD_FAILURE() << store.status();
    return out;
  }
  TrainerOptions options;
  options.batch_size = batch;
  options.epochs = 1;
  options.max_steps = steps;
  options.seed = 7;
  options.evaluate = false;
  options.overlap = overlap;
  model::ModelConfig model;
  model.name = model_name;
  model.mlp_hidden = {32};
  auto trainer = Trainer::Create(options, model, devices, store->get(), &data, nullptr);
  if (!trainer.ok()) {
    ADD_FAILURE() << model_name << " on " << devices_text << ": " << trainer.status();
    return out;
  }
  auto report = (*trainer)->Run();
  if (!report.ok()) {
    ADD_FAILURE() << model_name << " on " << devices_text << ": " << report.status();
    return out;
  }
  EXPECT_EQ(report->steps, steps);
  out.report = *report;
  auto params = (*trainer)->model().flat_parameters().ToVector();
  if (!params.ok()) {
    ADD_FAILURE() << params.status();
    return out;
  }
  out.parameters = std::move(params).value();
  return out;
}

// |a - b| / max(1e-3, |b|) <= rtol everywhere; names the worst element.
void ExpectRelativelyClose(const std::vector<float>& a, const std::vector<float>& b, double rtol,
                           const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  ASSERT_FALSE(a.empty()) << what;
  double worst = 0;
  size_t worst_i = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double err = std::fabs(double(a[i]) - b[i]) / std::max(1e-3, std::fabs(double(b[i])));
    if (std::isnan(err)) {
      worst = err;
      worst_i = i;
      break;
    }
    if (err > worst) {
      worst = err;
      worst_i = i;
    }
  }
  EXPECT_LE(worst, rtol) << what << ": element " << worst_i << " " << a[worst_i] << " vs "
                         << b[worst_i] << " (max relative error " << worst << ")";
}

// CUDA device lists to compare: one GPU, two logical devices sharing it, and
// one device per GPU when there are two.
std::vector<std::string> CudaConfigs() {
  std::vector<std::string> configs = {"cuda:0", "cuda:0,0"};
  if (CudaGpuCount() >= 2) configs.push_back("cuda:0,1");
  return configs;
}

TEST(TrainerGpuTest, OneStepOnCudaMatchesOneCpuDevice) {
  PS_SKIP_WITHOUT_CUDA_GPU();
  const data::Dataset data = SyntheticDataset(512);
  for (const char* model : {"mlp", "lenet"}) {
    for (int64_t batch : {64, 37}) {  // 37: shards of unequal size
      const Trained cpu = Train(model, "cpu", batch, 1, data);
      for (const std::string& devices : CudaConfigs()) {
        const Trained gpu = Train(model, devices, batch, 1, data);
        ExpectRelativelyClose(gpu.parameters, cpu.parameters, 1e-4,
                              absl::StrCat(model, " batch ", batch, " on ", devices, " vs cpu"));
      }
    }
  }
}

// Several steps, so that the replicas other than 0 compute on broadcast
// parameters: a broken broadcast shows here, not after one step (every
// replica starts from the same initialisation).
TEST(TrainerGpuTest, LogicalDevicesOnOneGpuTrainLikeOneDevice) {
  PS_SKIP_WITHOUT_CUDA_GPU();
  const data::Dataset data = SyntheticDataset(512);
  for (const char* model : {"mlp", "lenet"}) {
    const Trained one = Train(model, "cuda:0", 60, 4, data);
    for (const char* devices : {"cuda:0,0", "cuda:0,0,0"}) {
      const Trained many = Train(model, devices, 60, 4, data);
      ExpectRelativelyClose(many.parameters, one.parameters, 1e-4,
                            absl::StrCat(model, " 4 steps on ", devices, " vs cuda:0"));
    }
  }
}

// With overlap, one CUDA device copies region by region (one model's worth
// all the same); several keep the copies after backward.
TEST(TrainerGpuTest, HostLinkCarriesOneModelEachWayPerStep) {
  PS_SKIP_WITHOUT_CUDA_GPU();
  const data::Dataset data = SyntheticDataset(256);
  for (const std::string& devices : CudaConfigs()) {
    for (bool overlap : {true, false}) {
      const Trained t = Train("lenet", devices, 60, 3, data, overlap);
      const double model_bytes = 4.0 * t.report.model_parameters;
      EXPECT_GT(model_bytes, 0) << devices;
      EXPECT_EQ(t.report.model_bytes_to_host_per_step, model_bytes) << devices << " " << overlap;
      EXPECT_EQ(t.report.model_bytes_to_device_per_step, model_bytes) << devices << " " << overlap;
    }
  }
}

// One CUDA device overlapping its copies with compute (worker/device_overlap.h:
// gradients copied on the copy stream as backward issues each region,
// parameters copied ahead of each layer's forward) runs the same kernels in
// the same order as copying the whole model after backward: the same
// parameters, bit for bit. A difference means a copy raced a kernel.
TEST(TrainerGpuTest, OverlapOnOneCudaDeviceIsBitIdenticalToCopyingAfterBackward) {
  PS_SKIP_WITHOUT_CUDA_GPU();
  const data::Dataset data = SyntheticDataset(512);
  for (const char* model : {"mlp", "lenet"}) {
    for (int64_t batch : {64, 37}) {
      const Trained after = Train(model, "cuda:0", batch, 4, data, /*overlap=*/false);
      const Trained overlapped = Train(model, "cuda:0", batch, 4, data, /*overlap=*/true);
      ASSERT_FALSE(after.parameters.empty());
      EXPECT_EQ(overlapped.parameters, after.parameters) << model << " batch " << batch;
    }
  }
}

}  // namespace
}  // namespace ps::worker
