#include "worker/model_profiler.h"

#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/cpu_device.h"
#include "gtest/gtest.h"
#include "worker/model/model.h"
#include "worker/model/model_profile.h"

namespace ps::worker {
namespace {

ModelProfilerOptions Options() {
  ModelProfilerOptions options;
  options.warmup_passes = 1;
  options.passes = 3;
  options.model_name = "mlp-64";
  options.input = "1x8x8 float32 zeros, 10 classes";
  options.measured.where = "a test";
  options.measured.date = "2026-12-06T00:00Z";
  options.measured.cpu = "any";
  options.measured.software = {{"ps", "test"}};
  return options;
}

TEST(ModelProfilerTest, MeasuresEveryLayerAndWritesAValidProfileThatReplays) {
  CpuDevice device(0, 1);
  model::ModelConfig config;
  config.name = "mlp";
  config.input_shape = {1, 8, 8};
  config.mlp_hidden = {64, 32};
  auto model = model::Model::Create(config, &device);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE((*model)->Initialize(1).ok());
  auto inputs = Tensor::Zeros(&device, {16, 1, 8, 8});
  auto labels = Tensor::Zeros(&device, {16}, DType::kI32);
  ASSERT_TRUE(inputs.ok() && labels.ok());

  auto profile = MeasureModelProfile(**model, *inputs, *labels, Clock::Real(), Options());
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_EQ(profile->batch_size, 16);
  EXPECT_EQ(profile->measured.steps, 3);
  EXPECT_EQ(profile->measured.warmup_steps, 1);
  ASSERT_EQ(profile->tensors.size(), 6u);
  EXPECT_EQ(profile->tensors[0].name, "fc1.weight");
  EXPECT_EQ(profile->tensors[0].shape, (Shape{64, 64}));
  ASSERT_EQ(profile->layers.size(), 3u);
  const std::vector<std::string> names = {"fc1", "fc2", "fc3"};
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(profile->layers[k].name, names[k]);
    EXPECT_EQ(profile->layers[k].tensors,
              (std::vector<std::string>{names[k] + ".weight", names[k] + ".bias"}));
    EXPECT_GE(profile->layers[k].forward_ms, 0);
    EXPECT_GE(profile->layers[k].backward_ms, 0);
  }
  EXPECT_GT(profile->total_forward_ms + profile->total_backward_ms, 0);

  // The hooks and observer are gone; the JSON reads back; the profile replays.
  absl::StatusOr<model::ModelProfile> read =
      model::ParseModelProfile(model::ModelProfileToJson(*profile));
  ASSERT_TRUE(read.ok()) << read.status();
  model::ModelConfig replay;
  replay.name = "profile";
  replay.profile = std::make_shared<const model::ModelProfile>(*read);
  auto replayed = model::Model::Create(replay, &device);
  ASSERT_TRUE(replayed.ok()) << replayed.status();
  EXPECT_EQ((*replayed)->parameters(), (*model)->parameters());
  EXPECT_EQ((*replayed)->LayerParameterBegins(), (*model)->LayerParameterBegins());
}

TEST(ModelProfilerTest, RefusesBadPassCounts) {
  CpuDevice device(0, 1);
  model::ModelConfig config;
  config.name = "softmax";
  config.input_shape = {1, 2, 2};
  auto model = model::Model::Create(config, &device);
  ASSERT_TRUE(model.ok());
  auto inputs = Tensor::Zeros(&device, {2, 1, 2, 2});
  auto labels = Tensor::Zeros(&device, {2}, DType::kI32);
  ModelProfilerOptions options = Options();
  options.passes = 0;
  EXPECT_EQ(MeasureModelProfile(**model, *inputs, *labels, Clock::Real(), options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ps::worker
