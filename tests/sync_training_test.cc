// The core promise: synchronous training with W workers x D devices through
// the real gRPC server gives the parameters of one device running SGD on the
// same global batches.

#include <cmath>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cpu_device.h"
#include "gtest/gtest.h"
#include "server/in_process_server.h"
#include "worker/data/synthetic.h"
#include "worker/local_parameter_store.h"
#include "worker/remote_parameter_store.h"
#include "worker/sharded_parameter_store.h"
#include "worker/trainer.h"

namespace ps {
namespace {

constexpr int64_t kSteps = 20;
constexpr int64_t kGlobalBatch = 30;  // 15 per worker: shards of 8 and 7
constexpr uint64_t kSeed = 11;

OptimizerOptions Sgd() {
  OptimizerOptions o;
  o.sgd.lr = 0.05f;
  o.sgd.momentum = 0.9f;
  o.sgd.weight_decay = 5e-4f;
  return o;
}

// "wide_mlp": an MLP whose first layer (1,100 outputs) computes in blocks
// of 512 output features (ModelConfig::linear_block_rows) and under
// overlap waits for, and hands over, its parameters block by block.
worker::model::ModelConfig Config(const std::string& name) {
  worker::model::ModelConfig config;
  config.name = name == "wide_mlp" ? "mlp" : name;
  config.mlp_hidden = name == "wide_mlp" ? std::vector<int64_t>{1100, 24}
                                         : std::vector<int64_t>{48, 24};
  if (name == "wide_mlp") config.linear_block_rows = 512;
  return config;
}

worker::TrainerOptions Options() {
  worker::TrainerOptions options;
  options.batch_size = kGlobalBatch;
  options.epochs = 100;
  options.max_steps = kSteps;
  options.seed = kSeed;
  options.evaluate = false;
  return options;
}

worker::data::Dataset Data() {
  worker::data::SyntheticOptions options;
  options.size = 200;  // several epochs in 20 steps: exercises reshuffling
  auto data = worker::data::MakeSyntheticDataset(options);
  EXPECT_TRUE(data.ok()) << data.status();
  return std::move(data).value();
}

std::vector<float> TrainOnOneDevice(const std::string& model, const worker::data::Dataset& data,
                                    Precision precision = Precision::kFp32) {
  CpuDevice device(0, 1);
  auto store = worker::LocalParameterStore::Create(Sgd());
  EXPECT_TRUE(store.ok());
  worker::TrainerOptions options = Options();
  options.precision = precision;
  auto trainer =
      worker::Trainer::Create(options, Config(model), {&device}, store->get(), &data, nullptr);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  auto report = (*trainer)->Run();
  EXPECT_TRUE(report.ok()) << report.status();
  return *(*trainer)->model().flat_parameters().ToVector();
}

// `shards` == 1: one server and RemoteParameterStore; more: that many
// servers and the ShardedParameterStore over them.
// `overlap`: TrainerOptions::overlap (in effect with one device per
// worker), with one bucket per message so the pipeline has many.
std::vector<float> TrainDistributed(const std::string& model, const worker::data::Dataset& data,
                                    int workers, int devices_per_worker, int shards = 1,
                                    bool overlap = true, Precision precision = Precision::kFp32) {
  // gRPC parameter servers on free loopback ports, in this process. They
  // know no model: the workers state it (each shard its part), and rank 0
  // sends the initial parameters.
  server::ParameterServerOptions server_options;
  server_options.num_workers = workers;
  server_options.optimizer = Sgd();
  server_options.chunk_elements = 1000;  // several chunks per large tensor
  std::vector<std::unique_ptr<server::InProcessServer>> servers;
  std::vector<std::string> addresses;
  for (int s = 0; s < shards; ++s) {
    auto started = server::InProcessServer::Start(server_options);
    if (!started.ok()) {
      ADD_FAILURE() << started.status();
      return {};
    }
    addresses.push_back((*started)->address());
    servers.push_back(std::move(started).value());
  }
  std::vector<std::vector<float>> results(workers);
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      std::vector<std::unique_ptr<CpuDevice>> owned;
      std::vector<Device*> devices;
      for (int d = 0; d < devices_per_worker; ++d) {
        owned.push_back(std::make_unique<CpuDevice>(d, 1));
        devices.push_back(owned.back().get());
      }
      worker::RemoteStoreOptions options;
      options.server_address = addresses[0];
      options.worker_id = absl::StrCat("worker-", w);
      options.steps_per_epoch = (data.size() + Options().batch_size - 1) / Options().batch_size;
      std::unique_ptr<worker::ParameterStore> store;
      std::function<int64_t()> bytes_pushed, bytes_pulled;
      if (shards == 1) {
        auto remote = worker::RemoteParameterStore::Create(options);
        ASSERT_TRUE(remote.ok()) << remote.status();
        bytes_pushed = [r = remote->get()] { return r->bytes_pushed(); };
        bytes_pulled = [r = remote->get()] { return r->bytes_pulled(); };
        store = std::move(remote).value();
      } else {
        worker::ShardedStoreOptions sharded;
        sharded.shard_addresses = addresses;
        sharded.remote = options;
        auto remote = worker::ShardedParameterStore::Create(sharded);
        ASSERT_TRUE(remote.ok()) << remote.status();
        bytes_pushed = [r = remote->get()] { return r->bytes_pushed(); };
        bytes_pulled = [r = remote->get()] { return r->bytes_pulled(); };
        store = std::move(remote).value();
      }
      worker::TrainerOptions trainer_options = Options();
      trainer_options.overlap = overlap;
      trainer_options.precision = precision;
      trainer_options.push_pull.bucket_bytes = 0;
      trainer_options.push_pull.stage_early_pulls = true;  // as the worker daemon
      auto trainer = worker::Trainer::Create(trainer_options, Config(model), devices, store.get(),
                                             &data, nullptr);
      ASSERT_TRUE(trainer.ok()) << trainer.status();
      auto report = (*trainer)->Run();
      ASSERT_TRUE(report.ok()) << report.status();
      EXPECT_EQ(report->steps, kSteps);
      // One model's worth each way per step over the wire (+1 initial pull;
      // rank 0's Initialize is not a push).
      const int64_t model_bytes = report->model_parameters * 4;
      EXPECT_EQ(bytes_pushed(), kSteps * model_bytes);
      EXPECT_EQ(bytes_pulled(), (kSteps + 1) * model_bytes);
      results[w] = *(*trainer)->model().flat_parameters().ToVector();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int s = 0; s < shards; ++s) {
    EXPECT_EQ(servers[s]->domain().version(), kSteps) << "shard " << s;
  }
  for (int w = 1; w < workers; ++w) EXPECT_EQ(results[w], results[0]) << "worker " << w;
  return results[0];
}

void ExpectRelativelyClose(const std::vector<float>& got, const std::vector<float>& want,
                           double rtol) {
  ASSERT_EQ(got.size(), want.size());
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - want[i]) / std::max(1e-2, std::fabs(double(want[i])));
    if (err > worst) worst = err, at = i;
  }
  EXPECT_LE(worst, rtol) << "worst element " << at << ": " << got[at] << " vs " << want[at];
}

TEST(SyncTrainingTest, TwoWorkersTimesTwoDevicesEqualOneDeviceMlp) {
  const worker::data::Dataset data = Data();
  const auto one = TrainOnOneDevice("mlp", data);
  const auto distributed = TrainDistributed("mlp", data, 2, 2);
  ExpectRelativelyClose(distributed, one, 1e-4);
}

TEST(SyncTrainingTest, TwoWorkersTimesTwoDevicesEqualOneDeviceLenet) {
  const worker::data::Dataset data = Data();
  const auto one = TrainOnOneDevice("lenet", data);
  const auto distributed = TrainDistributed("lenet", data, 2, 2);
  ExpectRelativelyClose(distributed, one, 1e-4);
}

// The promise holds in mixed precision too: the bf16 rounding of each GEMM
// operand is the same whichever device computes it, so only fp32
// accumulation order differs, as in fp32.
TEST(SyncTrainingTest, TwoWorkersTimesTwoDevicesEqualOneDeviceInBf16) {
  const worker::data::Dataset data = Data();
  for (const char* model : {"mlp", "lenet"}) {
    SCOPED_TRACE(model);
    const auto one = TrainOnOneDevice(model, data, Precision::kBf16);
    const auto distributed =
        TrainDistributed(model, data, 2, 2, 1, /*overlap=*/true, Precision::kBf16);
    ExpectRelativelyClose(distributed, one, 1e-4);
    // And it is bf16: not fp32's parameters.
    const auto fp32 = TrainOnOneDevice(model, data);
    EXPECT_NE(one, fp32);
  }
}

// Three workers' pushes reach the server in whatever order their threads and
// gRPC give; the server sums in rank order, so two runs agree bit for bit.
TEST(SyncTrainingTest, ThreeWorkerRunsAreBitIdentical) {
  const worker::data::Dataset data = Data();
  const auto first = TrainDistributed("mlp", data, 3, 1);
  const auto second = TrainDistributed("mlp", data, 3, 1);
  ASSERT_FALSE(first.empty());
  EXPECT_EQ(first, second);
  ExpectRelativelyClose(first, TrainOnOneDevice("mlp", data), 1e-4);
}

// Sharded: the model cut over 2 or 3 servers (LeNet's fc and conv weights
// split by element range) trains exactly as on one.
TEST(SyncTrainingTest, TwoWorkersTimesTwoDevicesOnTwoShardsEqualOneDevice) {
  const worker::data::Dataset data = Data();
  ExpectRelativelyClose(TrainDistributed("lenet", data, 2, 2, /*shards=*/2),
                        TrainOnOneDevice("lenet", data), 1e-4);
}

TEST(SyncTrainingTest, TwoWorkersTimesTwoDevicesOnThreeShardsEqualOneDevice) {
  const worker::data::Dataset data = Data();
  ExpectRelativelyClose(TrainDistributed("mlp", data, 2, 2, /*shards=*/3),
                        TrainOnOneDevice("mlp", data), 1e-4);
}

// Sharding changes no sum and no update: each element is summed over the
// ranks in rank order and updated by the same SGD on whichever shard holds
// it, so one server and two shards give bit-identical parameters.
TEST(SyncTrainingTest, OneAndTwoShardsAreBitIdentical) {
  const worker::data::Dataset data = Data();
  const auto one = TrainDistributed("mlp", data, 2, 1, /*shards=*/1);
  const auto two = TrainDistributed("mlp", data, 2, 1, /*shards=*/2);
  ASSERT_FALSE(one.empty());
  EXPECT_EQ(one, two);
}

// The pipeline changes when bytes move, not what is summed or updated: each
// bucket's pushes are summed in rank order and updated by the same SGD as
// soon as every worker has pushed it, so overlap on and off, on one shard or
// two, give bit-identical parameters, and the overlapped run equals one
// device.
TEST(SyncTrainingTest, OverlapOnAndOffOnOneAndTwoShardsAreBitIdentical) {
  const worker::data::Dataset data = Data();
  const auto off = TrainDistributed("lenet", data, 2, 1, /*shards=*/1, /*overlap=*/false);
  const auto on = TrainDistributed("lenet", data, 2, 1, /*shards=*/1, /*overlap=*/true);
  const auto on_two_shards = TrainDistributed("lenet", data, 2, 1, /*shards=*/2, /*overlap=*/true);
  ASSERT_FALSE(off.empty());
  EXPECT_EQ(on, off);
  EXPECT_EQ(on_two_shards, off);
  ExpectRelativelyClose(on, TrainOnOneDevice("lenet", data), 1e-4);
}

// Layers that wait for and hand over their parameters in blocks, with the
// early pulls staged: the same bits with overlap on and off, on one and two
// shards, and the single device's result.
TEST(SyncTrainingTest, BlockedLayersOverlappingAreBitIdenticalToNoOverlap) {
  const worker::data::Dataset data = Data();
  const auto off = TrainDistributed("wide_mlp", data, 2, 1, /*shards=*/1, /*overlap=*/false);
  const auto on = TrainDistributed("wide_mlp", data, 2, 1, /*shards=*/1, /*overlap=*/true);
  const auto on_two_shards =
      TrainDistributed("wide_mlp", data, 2, 1, /*shards=*/2, /*overlap=*/true);
  ASSERT_FALSE(off.empty());
  EXPECT_EQ(on, off);
  EXPECT_EQ(on_two_shards, off);
  ExpectRelativelyClose(on, TrainOnOneDevice("wide_mlp", data), 1e-4);
}

TEST(SyncTrainingTest, ThreeWorkersOverlappingOnThreeShardsEqualOneDevice) {
  const worker::data::Dataset data = Data();
  ExpectRelativelyClose(TrainDistributed("mlp", data, 3, 1, /*shards=*/3, /*overlap=*/true),
                        TrainOnOneDevice("mlp", data), 1e-4);
}

}  // namespace
}  // namespace ps
