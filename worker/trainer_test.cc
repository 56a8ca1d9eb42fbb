#include "worker/trainer.h"

#include <cmath>
#include <memory>
#include <vector>

#include "common/cpu_device.h"
#include "gtest/gtest.h"
#include "worker/data/synthetic.h"
#include "worker/local_parameter_store.h"
#include "worker/trainer_test_util.h"

namespace ps::worker {
namespace {

using testing::MomentumSgd;
using testing::SyntheticDataset;

// Trains `steps` steps with `d` CPU devices (1 thread each) and returns the
// final parameters.
std::vector<float> TrainWithDevices(const std::string& model_name, int d, int64_t batch,
                                    int64_t steps, const data::Dataset& data,
                                    int64_t* bytes_to_host, int64_t* bytes_to_device) {
  std::vector<std::unique_ptr<CpuDevice>> owned;
  std::vector<Device*> devices;
  for (int i = 0; i < d; ++i) {
    owned.push_back(std::make_unique<CpuDevice>(i, 1));
    devices.push_back(owned.back().get());
  }
  auto store = LocalParameterStore::Create(MomentumSgd());
  EXPECT_TRUE(store.ok()) << store.status();
  TrainerOptions options;
  options.batch_size = batch;
  options.epochs = 1;
  options.max_steps = steps;
  options.seed = 7;
  options.evaluate = false;
  model::ModelConfig model;
  model.name = model_name;
  model.mlp_hidden = {32};
  auto trainer = Trainer::Create(options, model, devices, store->get(), &data, nullptr);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  auto report = (*trainer)->Run();
  EXPECT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->steps, steps);
  if (bytes_to_host != nullptr) {
    *bytes_to_host = static_cast<int64_t>(report->model_bytes_to_host_per_step);
    *bytes_to_device = static_cast<int64_t>(report->model_bytes_to_device_per_step);
  }
  auto params = (*trainer)->model().flat_parameters().ToVector();
  EXPECT_TRUE(params.ok());
  return *params;
}

void ExpectRelativelyClose(const std::vector<float>& a, const std::vector<float>& b, double rtol,
                           const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  double worst = 0;
  size_t worst_i = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double err = std::fabs(double(a[i]) - b[i]) / std::max(1e-3, std::fabs(double(b[i])));
    if (err > worst) {
      worst = err;
      worst_i = i;
    }
  }
  EXPECT_LE(worst, rtol) << what << ": element " << worst_i << " " << a[worst_i] << " vs "
                         << b[worst_i];
}

// Issue 3's promise: D devices on one batch give the update of one device,
// also when the batch does not divide by D.
TEST(TrainerTest, OneStepIsTheSameOnOneTwoAndThreeDevices) {
  const data::Dataset data = SyntheticDataset(512);
  for (const char* model : {"mlp", "lenet"}) {
    for (int64_t batch : {64, 37}) {
      const auto one = TrainWithDevices(model, 1, batch, 1, data, nullptr, nullptr);
      for (int d : {2, 3}) {
        const auto many = TrainWithDevices(model, d, batch, 1, data, nullptr, nullptr);
        ExpectRelativelyClose(many, one, 1e-5,
                              absl::StrCat(model, " batch ", batch, " on ", d, " devices"));
      }
    }
  }
}

TEST(TrainerTest, HostLinkCarriesOneModelEachWayPerStepWhateverD) {
  const data::Dataset data = SyntheticDataset(256);
  for (int d : {1, 2, 3}) {
    int64_t to_host = 0, to_device = 0;
    TrainWithDevices("lenet", d, 60, 3, data, &to_host, &to_device);
    EXPECT_EQ(to_host, 61706 * 4) << d << " devices";
    EXPECT_EQ(to_device, 61706 * 4) << d << " devices";
  }
}

TEST(TrainerTest, CpuRunsAreBitReproducible) {
  const data::Dataset data = SyntheticDataset(256);
  const auto a = TrainWithDevices("lenet", 1, 32, 5, data, nullptr, nullptr);
  const auto b = TrainWithDevices("lenet", 1, 32, 5, data, nullptr, nullptr);
  EXPECT_EQ(a, b);
}

TEST(TrainerTest, LearnsTheSyntheticTask) {
  const data::Dataset train = SyntheticDataset(2048);
  data::SyntheticOptions test_options;
  test_options.size = 512;
  test_options.first_index = 1 << 20;
  auto test = data::MakeSyntheticDataset(test_options);
  ASSERT_TRUE(test.ok());
  CpuDevice device(0, 2);
  auto store = LocalParameterStore::Create(MomentumSgd());
  ASSERT_TRUE(store.ok());
  TrainerOptions options;
  options.batch_size = 64;
  options.epochs = 2;
  model::ModelConfig model;
  model.name = "mlp";
  model.mlp_hidden = {64};
  auto trainer = Trainer::Create(options, model, {&device}, store->get(), &train, &*test);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  std::vector<EpochStats> seen;
  (*trainer)->set_epoch_callback([&](const EpochStats& e) { seen.push_back(e); });
  auto report = (*trainer)->Run();
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_LT(seen[1].train_loss, seen[0].train_loss);
  EXPECT_GT(report->final_test_accuracy, 0.9);
  EXPECT_EQ(report->steps, 2 * 32);
  const std::string json = TrainingReportToJson(*report);
  for (const char* key : {"\"final_test_accuracy\"", "\"final_train_loss\"",
                          "\"samples_per_second\"", "\"epochs\"", "\"time_split\""}) {
    EXPECT_NE(json.find(key), std::string::npos) << key;
  }
}

TEST(TrainerTest, RejectsMismatchedDataAndBadOptions) {
  const data::Dataset data = SyntheticDataset(64);
  CpuDevice device(0, 1);
  auto store = LocalParameterStore::Create(MomentumSgd());
  model::ModelConfig model;
  model.input_shape = {3, 32, 32};
  auto trainer = Trainer::Create(TrainerOptions(), model, {&device}, store->get(), &data, nullptr);
  EXPECT_EQ(trainer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(trainer.status().message().find("[1, 28, 28]"), absl::string_view::npos);
  TrainerOptions bad;
  bad.batch_size = 0;
  EXPECT_EQ(Trainer::Create(bad, model::ModelConfig(), {&device}, store->get(), &data, nullptr)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ps::worker
