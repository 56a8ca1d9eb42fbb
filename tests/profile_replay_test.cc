// Models from outside, end to end: the committed PyTorch profiles of
// ResNet-50, VGG-16 and BERT-base replayed by a worker (--model=profile)
// through a real gRPC server in this process, and a profile the worker
// writes of its own model (--write_model_profile's measurement) validated
// by deploy/experiments/model_profile.py and replayed the same way.
//
// Each replayed step sleeps through the profile's layers at batch 1 (the
// profiles' times are per batch of 4 or 2: a quarter or a half of them) and
// pushes and pulls the model's bytes; VGG-16 (553 MB a step) runs one step.

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/cpu_device.h"
#include "gtest/gtest.h"
#include "server/in_process_server.h"
#include "worker/data/synthetic.h"
#include "worker/model/model.h"
#include "worker/model/model_profile.h"
#include "worker/model_profiler.h"
#include "worker/remote_parameter_store.h"
#include "worker/trainer.h"

namespace ps {
namespace {

using worker::model::ModelProfile;

std::vector<ParamSpec> Specs(const ModelProfile& profile) {
  std::vector<ParamSpec> specs;
  for (const ModelProfile::TensorEntry& t : profile.tensors) {
    specs.push_back(ParamSpec{t.name, t.shape, DType::kF32});
  }
  return specs;
}

// One worker trains `profile` for `steps` steps of batch 1 against a server
// of its own; checks what the server registered and what the worker moved.
void ReplayThroughServer(const ModelProfile& profile, int64_t steps) {
  server::ParameterServerOptions server_options;
  server_options.num_workers = 1;
  auto server = server::InProcessServer::Start(server_options);
  ASSERT_TRUE(server.ok()) << server.status();

  worker::data::SyntheticOptions data_options;
  data_options.size = 8;
  auto data = worker::data::MakeSyntheticDataset(data_options);
  ASSERT_TRUE(data.ok()) << data.status();
  worker::TrainerOptions options;
  options.batch_size = 1;
  options.max_steps = steps;
  options.evaluate = false;
  options.clock = Clock::Real();
  worker::model::ModelConfig model;
  model.name = "profile";
  model.profile = std::make_shared<const ModelProfile>(profile);

  worker::RemoteStoreOptions store_options;
  store_options.server_address = (*server)->address();
  store_options.worker_id = "worker-0";
  store_options.rank = 0;
  store_options.steps_per_epoch = data->size();
  auto store = worker::RemoteParameterStore::Create(store_options);
  ASSERT_TRUE(store.ok()) << store.status();
  CpuDevice device(0, 1);
  auto trainer = worker::Trainer::Create(options, model, {&device}, store->get(), &*data, nullptr);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  const absl::Time start = absl::Now();
  auto report = (*trainer)->Run();
  ASSERT_TRUE(report.ok()) << report.status();
  std::printf("%s: %lld step(s) in %.2f s\n", profile.model.c_str(), static_cast<long long>(steps),
              absl::ToDoubleSeconds(absl::Now() - start));

  // The server holds exactly the profile's tensors, in its order.
  EXPECT_EQ((*server)->domain().signature(), Specs(profile));
  int64_t model_bytes = 0;
  for (const ParamSpec& spec : Specs(profile)) model_bytes += 4 * NumElements(spec.shape);
  EXPECT_EQ(report->model_parameters * 4, model_bytes);
  // Every step pushed the model's gradients and pulled its parameters
  // (plus the first pull of the initial ones).
  EXPECT_EQ((*store)->bytes_pushed(), steps * model_bytes);
  EXPECT_EQ((*store)->bytes_pulled(), (steps + 1) * model_bytes);
  EXPECT_EQ((*server)->domain().version(), steps);
}

ModelProfile Committed(const std::string& name) {
  auto profile = worker::model::ReadModelProfile("deploy/experiments/profiles/" + name + ".json");
  EXPECT_TRUE(profile.ok()) << profile.status();
  return profile.ok() ? *profile : ModelProfile();
}

TEST(ProfileReplayTest, ResNet50) { ReplayThroughServer(Committed("resnet50"), 2); }
TEST(ProfileReplayTest, BertBase) { ReplayThroughServer(Committed("bert_base"), 2); }
TEST(ProfileReplayTest, Vgg16) { ReplayThroughServer(Committed("vgg16"), 1); }

TEST(ProfileReplayTest, AWrittenProfileOfABuiltInModelValidatesAndReplays) {
  CpuDevice device(0, 1);
  worker::model::ModelConfig config;
  config.name = "lenet";
  auto lenet = worker::model::Model::Create(config, &device);
  ASSERT_TRUE(lenet.ok()) << lenet.status();
  ASSERT_TRUE((*lenet)->Initialize(1).ok());
  auto inputs = Tensor::Zeros(&device, {32, 1, 28, 28});
  auto labels = Tensor::Zeros(&device, {32}, DType::kI32);
  ASSERT_TRUE(inputs.ok() && labels.ok());
  worker::ModelProfilerOptions options;
  options.model_name = "lenet";
  options.measured.where = "profile_replay_test";
  options.measured.date = "2026-12-06T00:00Z";
  options.measured.cpu = "any";
  options.measured.software = {{"ps-worker", "test"}};
  auto profile = worker::MeasureModelProfile(**lenet, *inputs, *labels, Clock::Real(), options);
  ASSERT_TRUE(profile.ok()) << profile.status();

  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/lenet.json");
  ASSERT_TRUE(worker::model::WriteModelProfile(*profile, path).ok());
  // Debian's Python: the validator needs only its standard library.
  const std::string validate =
      absl::StrCat("/usr/bin/python3 deploy/experiments/model_profile.py ", path);
  EXPECT_EQ(std::system(validate.c_str()), 0) << validate;

  auto read = worker::model::ReadModelProfile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(Specs(*read), (*lenet)->parameters());
  ReplayThroughServer(*read, 2);
}

}  // namespace
}  // namespace ps
