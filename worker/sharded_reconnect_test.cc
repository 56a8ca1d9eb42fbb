// ShardedParameterStore::Reconnect against whole servers (RunServer, with
// checkpoints) in this process: a shard that comes back from an older
// checkpoint than the others makes every shard go back to it (Restore) and
// the workers, reconnecting concurrently, end bit for bit where a run
// without the fault ends; a shard that comes back with another run's
// checkpoints is refused by name.

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include <grpcpp/grpcpp.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/parameter_server.grpc.pb.h"
#include "server/run_server.h"
#include "worker/remote_parameter_store.h"
#include "worker/sharded_parameter_store.h"

namespace ps::worker {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

std::vector<ParamSpec> Signature() {
  return {{"a.weight", {37, 23}, DType::kF32},
          {"a.bias", {37}, DType::kF32},
          {"b.weight", {5, 37}, DType::kF32},
          {"b.bias", {5}, DType::kF32}};
}
constexpr int64_t kElements = 37 * 23 + 37 + 5 * 37 + 5;
constexpr int kWorkers = 2;
constexpr int kShards = 2;
constexpr int64_t kIterations = 8;

std::vector<float> Initial() {
  std::vector<float> v(kElements);
  for (int64_t i = 0; i < kElements; ++i) v[i] = 0.01f * static_cast<float>((i * 7) % 13) - 0.06f;
  return v;
}

// One shard: a whole server (RunServer) on a thread, restartable on its port.
class Shard {
 public:
  Shard(std::string dir, int port, int workers = kWorkers)
      : dir_(std::move(dir)), port_(port), workers_(workers) {}
  ~Shard() { Stop().IgnoreError(); }

  void Start() {
    server::ServerOptions options;
    options.job.num_workers = workers_;
    options.job.chunk_elements = 100;
    options.job.optimizer.sgd.lr = 0.1f;
    options.job.optimizer.sgd.momentum = 0.9f;
    options.port = port_;
    options.port_file = absl::StrCat(dir_, ".port", starts_++);
    options.checkpoint_dir = dir_;
    options.checkpoint_every_steps = 2;
    options.checkpoint_keep = 10;
    fs::remove(options.port_file);
    stop_ = std::make_unique<server::StopRequest>();
    thread_ = std::thread([this, options] { status_ = server::RunServer(options, stop_.get()); });
    // Written once the server serves, maybe in pieces: read until whole.
    int port = 0;
    for (int i = 0; i < 2000 && port <= 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      std::string line;
      if (std::getline(std::ifstream(options.port_file), line) && !line.empty()) {
        port = std::atoi(line.c_str());
      }
    }
    ASSERT_GT(port, 0);
    port_ = port;
  }
  // A SIGTERM's stop (with a final checkpoint); OK or RunServer's error.
  absl::Status Stop() {
    if (!thread_.joinable()) return status_;
    stop_->Request("the test");
    thread_.join();
    return status_;
  }
  // Deletes the checkpoints newer than `version`: the shard then resumes
  // older than the others, as one killed before its newest write would.
  void ForgetAfter(int64_t version) {
    for (const fs::directory_entry& e : fs::directory_iterator(dir_)) {
      const std::string name = e.path().filename().string();
      const size_t dash = name.find('-');
      const size_t dot = name.find('.');
      if (!e.is_regular_file() || dash == std::string::npos || dot == std::string::npos) continue;
      if (std::stoll(name.substr(dash + 1, dot - dash - 1)) > version) fs::remove(e.path());
    }
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  const std::string& dir() const { return dir_; }

 private:
  const std::string dir_;
  int port_;
  const int workers_;
  int starts_ = 0;
  std::unique_ptr<server::StopRequest> stop_;
  std::thread thread_;
  absl::Status status_;
};

std::vector<std::unique_ptr<Shard>> StartShards(const std::string& tag) {
  std::vector<std::unique_ptr<Shard>> shards;
  for (int s = 0; s < kShards; ++s) {
    const std::string dir = absl::StrCat(testing::TempDir(), "/", tag, "-shard", s);
    fs::remove_all(dir);
    shards.push_back(std::make_unique<Shard>(dir, 0));
    shards.back()->Start();
  }
  return shards;
}

std::unique_ptr<ShardedParameterStore> MakeStore(const std::vector<std::unique_ptr<Shard>>& shards,
                                                 int rank) {
  ShardedStoreOptions options;
  for (const auto& shard : shards) options.shard_addresses.push_back(shard->address());
  options.remote.worker_id = absl::StrCat("w", rank);
  options.remote.rank = rank;
  options.remote.rpc_timeout = absl::Seconds(20);
  options.remote.wait_timeout = absl::Seconds(30);
  options.remote.reconnect_timeout = absl::Seconds(30);
  auto store = ShardedParameterStore::Create(options);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? std::move(store).value() : nullptr;
}

// One store per worker, rank w at w.
std::vector<std::unique_ptr<ShardedParameterStore>> MakeStores(
    const std::vector<std::unique_ptr<Shard>>& shards) {
  std::vector<std::unique_ptr<ShardedParameterStore>> stores;
  for (int w = 0; w < kWorkers; ++w) stores.push_back(MakeStore(shards, w));
  return stores;
}

// Worker `rank` trains from `reg`'s version to kIterations with a made-up
// gradient that depends on the parameters and the iteration, reconnecting
// whenever a shard is lost; returns its parameters.
std::vector<float> TrainFrom(ShardedParameterStore& store, ParameterStore::Registration reg,
                             int rank, int64_t until) {
  std::vector<float> params(kElements), grad(kElements);
  int64_t t = reg.version;
  bool pull = true;
  for (int failures = 0; failures < 20;) {
    absl::Status status;
    if (pull) {
      absl::StatusOr<int64_t> v = store.Pull(t, absl::MakeSpan(params));
      status = v.status();
    }
    if (status.ok()) {
      pull = false;
      if (t == until) return params;
      for (int64_t i = 0; i < kElements; ++i) {
        grad[i] = std::sin(0.37f * static_cast<float>(i) + static_cast<float>(t + rank)) +
                  0.1f * params[i];
      }
      status = store.Push(t, rank + 2, grad);
      if (status.ok()) status = store.WaitForVersion(t + 1);
      if (status.ok()) {
        ++t;
        pull = true;
        continue;
      }
    }
    EXPECT_TRUE(IsServerLost(status)) << status;
    if (!IsServerLost(status)) return {};
    ++failures;
    absl::StatusOr<ParameterStore::Registration> again = store.Reconnect(Signature(), Initial());
    EXPECT_TRUE(again.ok()) << again.status();
    if (!again.ok()) return {};
    t = again->version;
    pull = true;
  }
  ADD_FAILURE() << "worker " << rank << " lost its shards 20 times";
  return {};
}

// Every worker registers and trains to `until` concurrently.
std::vector<std::vector<float>> Train(std::vector<std::unique_ptr<ShardedParameterStore>>& stores,
                                      int64_t until) {
  std::vector<std::vector<float>> results(kWorkers);
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      auto reg = stores[w]->Register(Signature(), Initial());
      ASSERT_TRUE(reg.ok()) << reg.status();
      results[w] = TrainFrom(*stores[w], *reg, w, until);
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

TEST(ShardedReconnectTest, AShardBackFromAnOlderCheckpointTakesEveryShardBackBitForBit) {
  std::vector<float> reference;
  {
    auto shards = StartShards("reference");
    auto stores = MakeStores(shards);
    reference = Train(stores, kIterations)[0];
    ASSERT_EQ(reference.size(), static_cast<size_t>(kElements));
    EXPECT_FALSE(stores[0]->job_run().empty());
    EXPECT_EQ(stores[0]->job_run(), stores[1]->job_run());
  }

  auto shards = StartShards("restored");
  auto stores = MakeStores(shards);
  // 1. Five iterations, checkpoints at 2 and 4 (and 5, shard 1's final).
  Train(stores, 5);
  // 2. Shard 1 comes back from version 2, shard 0 stays at 5.
  ASSERT_TRUE(shards[1]->Stop().ok());
  shards[1]->ForgetAfter(2);
  shards[1]->Start();
  // 3. Both workers find it lost, reconnect concurrently (each asks shard
  //    0 to restore 2) and train to the end.
  std::vector<std::vector<float>> results(kWorkers);
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      ParameterStore::Registration at5;
      at5.version = 5;
      results[w] = TrainFrom(*stores[w], at5, w, kIterations);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int w = 0; w < kWorkers; ++w) {
    EXPECT_TRUE(results[w] == reference) << "worker " << w << " differs from the fault-free run";
  }
  // Shard 0's checkpoints past 2 were set aside, not deleted.
  EXPECT_TRUE(fs::exists(absl::StrCat(shards[0]->dir(), "/abandoned/checkpoint-000000000004.json")));
  for (auto& shard : shards) EXPECT_TRUE(shard->Stop().ok());
}

// The whole job restarted, workers too, its shards from checkpoints of
// different versions: the new workers' registration brings every shard to
// the older one, and the job ends where a run without the fault ends.
TEST(ShardedReconnectTest, AWholeJobRestartedResumesEveryShardAtOneVersion) {
  std::vector<float> reference;
  {
    auto shards = StartShards("whole-reference");
    auto stores = MakeStores(shards);
    reference = Train(stores, kIterations)[0];
  }
  auto shards = StartShards("whole");
  {
    auto stores = MakeStores(shards);
    Train(stores, 5);
  }
  for (auto& shard : shards) ASSERT_TRUE(shard->Stop().ok());
  shards[0]->ForgetAfter(4);
  shards[1]->ForgetAfter(2);
  for (auto& shard : shards) shard->Start();
  auto stores = MakeStores(shards);
  std::vector<std::vector<float>> results(kWorkers);
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      auto reg = stores[w]->Register(Signature(), Initial());
      ASSERT_TRUE(reg.ok()) << reg.status();
      EXPECT_EQ(reg->version, 2);
      results[w] = TrainFrom(*stores[w], *reg, w, kIterations);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int w = 0; w < kWorkers; ++w) {
    EXPECT_TRUE(results[w] == reference) << "worker " << w << " differs from the fault-free run";
  }
  for (auto& shard : shards) EXPECT_TRUE(shard->Stop().ok());
}

TEST(ShardedReconnectTest, AShardBackWithAnotherRunsCheckpointsIsRefusedByName) {
  auto other = StartShards("other-run");
  {
    auto stores = MakeStores(other);
    Train(stores, 2);
  }
  for (auto& shard : other) ASSERT_TRUE(shard->Stop().ok());

  auto shards = StartShards("this-run");
  auto stores = MakeStores(shards);
  Train(stores, 2);
  ASSERT_NE(stores[0]->job_run(), "");
  // Shard 1 restarted on its port with the other run's directory.
  ASSERT_TRUE(shards[1]->Stop().ok());
  Shard impostor(other[1]->dir(), std::stoi(shards[1]->address().substr(10)));
  impostor.Start();
  absl::StatusOr<ParameterStore::Registration> again = stores[0]->Reconnect(Signature(), Initial());
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(again.status().message(), HasSubstr(absl::StrCat("shard 1 of 2 (", shards[1]->address())));
  EXPECT_THAT(again.status().message(), HasSubstr("another job run"));
  EXPECT_TRUE(impostor.Stop().ok());
  EXPECT_TRUE(shards[0]->Stop().ok());
}

// A shard restarted with an empty checkpoint directory while the others
// are past version 0 is refused by name; with every shard at version 0 the
// job would just start again.
TEST(ShardedReconnectTest, AShardBackWithoutItsStateIsRefusedByName) {
  auto shards = StartShards("stateless");
  auto stores = MakeStores(shards);
  Train(stores, 3);
  ASSERT_TRUE(shards[1]->Stop().ok());
  const std::string empty = absl::StrCat(testing::TempDir(), "/stateless-empty");
  fs::remove_all(empty);
  Shard fresh(empty, std::stoi(shards[1]->address().substr(10)));
  fresh.Start();
  absl::StatusOr<ParameterStore::Registration> again = stores[1]->Reconnect(Signature(), Initial());
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(again.status().message(),
              HasSubstr(absl::StrCat("shard 1 of 2 (", shards[1]->address(),
                                     ") came back without this job's state")));
  EXPECT_THAT(again.status().message(), HasSubstr("is at version 3"));
  EXPECT_TRUE(fresh.Stop().ok());
  EXPECT_TRUE(shards[0]->Stop().ok());
}

// Restores a worker may not make, against a whole server: without a
// session, below 0, past the server's version, to a version it has no
// checkpoint of. Each is refused with its code, and nothing is lost: the
// worker's session still works, training goes on and checkpoints are
// still written.
TEST(ShardedReconnectTest, RefusedRestoresLoseNothing) {
  const std::string dir = absl::StrCat(testing::TempDir(), "/hostile");
  fs::remove_all(dir);
  Shard shard(dir, 0, /*workers=*/1);
  shard.Start();
  RemoteStoreOptions options;
  options.server_address = shard.address();
  options.worker_id = "w0";
  options.rpc_timeout = absl::Seconds(20);
  auto made = RemoteParameterStore::Create(options);
  ASSERT_TRUE(made.ok()) << made.status();
  RemoteParameterStore& store = **made;
  EXPECT_EQ(store.Restore(0).code(), absl::StatusCode::kFailedPrecondition);  // before Register
  ASSERT_TRUE(store.Register(Signature(), Initial()).ok());
  std::vector<float> params(kElements), grad(kElements, 0.5f);
  auto step = [&](int64_t t) {
    ASSERT_TRUE(store.Push(t, 1, grad).ok());
    ASSERT_TRUE(store.WaitForVersion(t + 1).ok());
    ASSERT_TRUE(store.Pull(t + 1, absl::MakeSpan(params)).ok());
  };
  for (int64_t t = 0; t < 5; ++t) ASSERT_NO_FATAL_FAILURE(step(t));

  absl::Status s = store.Restore(-1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  s = store.Restore(100);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  EXPECT_THAT(s.message(), HasSubstr("past this server's 5"));
  s = store.Restore(3);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("no valid checkpoint of version 3"));
  EXPECT_THAT(s.message(), HasSubstr("versions 0, 2, 4"));
  EXPECT_TRUE(store.Restore(5).ok());  // there already: nothing to do
  // No session: a raw call without one.
  {
    auto stub = proto::ParameterServer::NewStub(
        grpc::CreateChannel(shard.address(), grpc::InsecureChannelCredentials()));
    proto::RestoreRequest request;
    request.set_rank(0);
    request.set_version(4);
    proto::RestoreReply reply;
    grpc::ClientContext context;
    EXPECT_EQ(stub->Restore(&context, request, &reply).error_code(), grpc::StatusCode::ABORTED);
  }
  // The same session trains on, and the checkpoints go on.
  for (int64_t t = 5; t < 8; ++t) ASSERT_NO_FATAL_FAILURE(step(t));
  EXPECT_TRUE(store.Pull(8, absl::MakeSpan(params)).ok());
  EXPECT_TRUE(shard.Stop().ok());
  // (6 too, unless the checkpointer the refusal restarted came too late for
  // it: a multiple passed before its capture is filed is not written.)
  EXPECT_TRUE(fs::exists(absl::StrCat(dir, "/checkpoint-000000000008.json")));
  EXPECT_FALSE(fs::exists(absl::StrCat(dir, "/abandoned")));
}

}  // namespace
}  // namespace ps::worker
