#include "worker/sharded_parameter_store.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/fake_observer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/in_process_server.h"
#include "server/parameter_server_testing.h"
#include "worker/remote_parameter_store.h"

namespace ps::worker {
namespace {

using ::testing::HasSubstr;

// 1078 elements; with 2 or 3 shards the cuts fall inside a.weight (split
// into range pieces) and the small tensors ride whole.
std::vector<ParamSpec> Signature() {
  return {{"a.weight", {37, 23}, DType::kF32},
          {"a.bias", {37}, DType::kF32},
          {"b.weight", {5, 37}, DType::kF32},
          {"b.bias", {5}, DType::kF32}};
}
constexpr int64_t kElements = 37 * 23 + 37 + 5 * 37 + 5;
constexpr int64_t kIterations = 6;

std::vector<float> Initial(int rank) {
  std::vector<float> v(kElements);
  for (int64_t i = 0; i < kElements; ++i) v[i] = 0.01f * static_cast<float>((i * 7 + rank) % 13) - 0.06f;
  return v;
}

server::ParameterServerOptions ServerOptions(int workers) {
  server::ParameterServerOptions options;
  options.num_workers = workers;
  options.chunk_elements = 100;  // several chunks, and messages, per shard
  options.optimizer.sgd.lr = 0.1f;
  options.optimizer.sgd.momentum = 0.9f;
  options.optimizer.sgd.weight_decay = 5e-4f;
  return options;
}

std::vector<std::unique_ptr<server::InProcessServer>> StartServers(int count, int workers) {
  std::vector<std::unique_ptr<server::InProcessServer>> servers;
  for (int s = 0; s < count; ++s) {
    auto server = server::InProcessServer::Start(ServerOptions(workers));
    EXPECT_TRUE(server.ok()) << server.status();
    if (server.ok()) servers.push_back(std::move(server).value());
  }
  return servers;
}

std::vector<std::string> Addresses(const std::vector<std::unique_ptr<server::InProcessServer>>& s) {
  std::vector<std::string> out;
  for (const auto& server : s) out.push_back(server->address());
  return out;
}

RemoteStoreOptions Remote(const std::string& id, EventObserver* observer = nullptr,
                          int rank = -1) {
  RemoteStoreOptions options;
  options.worker_id = id;
  options.rank = rank;
  options.rpc_timeout = absl::Seconds(20);
  options.wait_timeout = absl::Seconds(30);
  options.observer = observer;
  return options;
}

std::unique_ptr<ShardedParameterStore> MakeSharded(const std::vector<std::string>& addresses,
                                                   const std::string& id,
                                                   EventObserver* observer = nullptr,
                                                   int rank = -1) {
  ShardedStoreOptions options;
  options.shard_addresses = addresses;
  options.remote = Remote(id, observer, rank);
  auto store = ShardedParameterStore::Create(options);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? std::move(store).value() : nullptr;
}

// One iteration of a worker: push `grad` for iteration t and bring the
// parameters of version t + 1 into `params`.
using Step = std::function<void(ParameterStore& store, int64_t t, int rank,
                                const std::vector<float>& grad, std::vector<float>& params)>;

// The blocking calls: push, wait, pull.
void WholeModelStep(ParameterStore& store, int64_t t, int rank, const std::vector<float>& grad,
                    std::vector<float>& params) {
  ASSERT_TRUE(store.Push(t, rank + 2, grad).ok());
  ASSERT_TRUE(store.WaitForVersion(t + 1).ok());
  auto pulled = store.Pull(t + 1, absl::MakeSpan(params));
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_EQ(*pulled, t + 1);
}

// Two workers train kIterations steps of a made-up gradient that depends on
// the parameters, so any difference in any update shows in the end. Each
// worker's store comes from `make(w)` and must ask for rank w (whose
// initial parameters are Initial(w)); returns each worker's parameters.
std::vector<std::vector<float>> Train(
    const std::function<std::unique_ptr<ParameterStore>(int)>& make, int workers,
    const Step& step = WholeModelStep) {
  std::vector<std::vector<float>> results(workers);
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      std::unique_ptr<ParameterStore> store = make(w);
      ASSERT_NE(store, nullptr);
      auto reg = store->Register(Signature(), Initial(w));
      ASSERT_TRUE(reg.ok()) << reg.status();
      std::vector<float> params(kElements), grad(kElements);
      auto v = store->Pull(reg->version, absl::MakeSpan(params));
      ASSERT_TRUE(v.ok()) << v.status();
      for (int64_t t = 0; t < kIterations; ++t) {
        for (int64_t i = 0; i < kElements; ++i) {
          grad[i] = std::sin(0.37f * static_cast<float>(i) + static_cast<float>(t + reg->rank)) +
                    0.1f * params[i];
        }
        step(*store, t, reg->rank, grad, params);
      }
      results[w] = params;
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

std::vector<float> OneServer(int workers) {
  auto servers = StartServers(1, workers);
  const std::string address = servers[0]->address();
  auto results = Train(
      [&](int w) -> std::unique_ptr<ParameterStore> {
        RemoteStoreOptions options = Remote(absl::StrCat("w", w), nullptr, w);
        options.server_address = address;
        auto store = RemoteParameterStore::Create(options);
        EXPECT_TRUE(store.ok());
        return std::move(store).value();
      },
      workers);
  return results[0];
}

TEST(ShardedParameterStoreTest, TwoAndThreeShardsEqualOneServerBitForBit) {
  const std::vector<float> reference = OneServer(2);
  ASSERT_EQ(reference.size(), static_cast<size_t>(kElements));
  for (int shards : {2, 3}) {
    SCOPED_TRACE(absl::StrCat(shards, " shards"));
    auto servers = StartServers(shards, 2);
    const auto addresses = Addresses(servers);
    auto results = Train(
        [&](int w) -> std::unique_ptr<ParameterStore> {
          return MakeSharded(addresses, absl::StrCat("w", w), nullptr, w);
        },
        2);
    EXPECT_EQ(results[0], reference);
    EXPECT_EQ(results[1], reference);
    // Each shard holds its part of the plan, under the plan's names, and
    // made every update.
    auto plan = PlanShards(Signature(), shards);
    ASSERT_TRUE(plan.ok());
    for (int s = 0; s < shards; ++s) {
      EXPECT_EQ(servers[s]->domain().signature(), plan->shards[s].signature()) << "shard " << s;
      EXPECT_EQ(servers[s]->domain().version(), kIterations);
    }
    EXPECT_TRUE(plan->shards[0].pieces.back().split);
  }
}

// Train's step segment by segment from the back (as backward produces
// them), each segment's pull started as soon as its push is accepted, all
// of them in flight together.
void SegmentBySegmentStep(ParameterStore& store, int64_t t, int rank,
                          const std::vector<float>& grad, std::vector<float>& params) {
  const std::vector<int64_t> ends = store.SegmentEnds();
  ASSERT_FALSE(ends.empty());
  EXPECT_EQ(ends.back(), kElements);
  EXPECT_TRUE(std::is_sorted(ends.begin(), ends.end()));
  const int segments = static_cast<int>(ends.size());
  absl::Mutex mu;
  int pending = segments;
  absl::Status first_error;
  auto finished = [&](absl::Status s) {
    absl::MutexLock lock(&mu);
    if (!s.ok() && first_error.ok()) first_error = s;
    --pending;
  };
  for (int seg = segments; seg-- > 0;) {
    ASSERT_TRUE(AwaitDone([&](ParameterStore::Done done) {
                  store.PushSegments(t, rank + 2, seg, seg + 1, grad, std::move(done));
                }).ok());
    store.PullSegments(t + 1, seg, seg + 1, absl::MakeSpan(params), finished);
  }
  absl::MutexLock lock(&mu);
  mu.Await(absl::Condition(+[](int* n) { return *n == 0; }, &pending));
  ASSERT_TRUE(first_error.ok()) << first_error;
}

// Under ssp:0 every shard reports each push message as 0 updates behind;
// the sharded store's histogram is the sum over its shards. Under sync the
// shards report none.
TEST(ShardedParameterStoreTest, StalenessHistogramSumsTheShards) {
  for (const char* consistency : {"ssp:0", "sync"}) {
    SCOPED_TRACE(consistency);
    std::vector<std::unique_ptr<server::InProcessServer>> servers;
    for (int s = 0; s < 2; ++s) {
      server::ParameterServerOptions options = ServerOptions(1);
      options.consistency = server::ParseConsistency(consistency).value();
      auto server = server::InProcessServer::Start(options);
      ASSERT_TRUE(server.ok()) << server.status();
      servers.push_back(std::move(server).value());
    }
    std::unique_ptr<ShardedParameterStore> store =
        MakeSharded(Addresses(servers), "w0", nullptr, 0);
    ASSERT_NE(store, nullptr);
    auto reg = store->Register(Signature(), Initial(0));
    ASSERT_TRUE(reg.ok()) << reg.status();
    std::vector<float> params(kElements), grad(kElements, 0.01f);
    for (int64_t t = 0; t < kIterations; ++t) WholeModelStep(*store, t, 0, grad, params);
    const std::map<int64_t, int64_t> histogram = store->staleness_histogram();
    if (std::string(consistency) == "sync") {
      EXPECT_TRUE(histogram.empty());
      continue;
    }
    ASSERT_EQ(histogram.size(), 1u);
    EXPECT_EQ(histogram.begin()->first, 0);
    // At least one message to each shard per push.
    EXPECT_GE(histogram.begin()->second, 2 * kIterations);
  }
}

TEST(ShardedParameterStoreTest, SegmentBySegmentEqualsWholeModelCallsBitForBit) {
  const std::vector<float> reference = OneServer(2);
  for (int shards : {1, 2, 3}) {
    SCOPED_TRACE(absl::StrCat(shards, " shards"));
    auto servers = StartServers(shards, 2);
    const auto addresses = Addresses(servers);
    auto results = Train(
        [&](int w) -> std::unique_ptr<ParameterStore> {
          if (shards == 1) {
            RemoteStoreOptions options = Remote(absl::StrCat("w", w), nullptr, w);
            options.server_address = addresses[0];
            auto store = RemoteParameterStore::Create(options);
            EXPECT_TRUE(store.ok());
            return std::move(store).value();
          }
          return MakeSharded(addresses, absl::StrCat("w", w), nullptr, w);
        },
        2, SegmentBySegmentStep);
    EXPECT_EQ(results[0], reference);
    EXPECT_EQ(results[1], reference);
  }
}

TEST(ShardedParameterStoreTest, ShardSegmentsFollowOneAnotherAndBadRangesAreRefused) {
  auto servers = StartServers(2, 1);
  auto store = MakeSharded(Addresses(servers), "only");
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(store->SegmentEnds().empty());  // before Register
  ASSERT_TRUE(store->Register(Signature(), Initial(0)).ok());
  const std::vector<int64_t> ends = store->SegmentEnds();
  // Each shard's messages hold at most 100 elements (its chunk size).
  int64_t begin = 0;
  for (int64_t end : ends) {
    EXPECT_LE(end - begin, 100);
    EXPECT_GT(end, begin);
    begin = end;
  }
  EXPECT_EQ(begin, kElements);
  // Each segment streams on its shard's connections: shard 0's first.
  const std::vector<int> streams = store->SegmentStreams();
  ASSERT_EQ(streams.size(), ends.size());
  EXPECT_TRUE(std::is_sorted(streams.begin(), streams.end()));
  EXPECT_EQ(streams.front(), 0);
  EXPECT_EQ(streams.back(), 1);
  std::vector<float> buffer(kElements);
  const int n = static_cast<int>(ends.size());
  for (auto [first, last] : std::vector<std::pair<int, int>>{{-1, 1}, {2, 1}, {0, n + 1}}) {
    EXPECT_EQ(AwaitDone([&](ParameterStore::Done done) {
                store->PushSegments(0, 1, first, last, buffer, std::move(done));
              }).code(),
              absl::StatusCode::kInvalidArgument)
        << first << ", " << last;
  }
  std::vector<float> short_buffer(kElements - 1);
  const absl::Status s = AwaitDone([&](ParameterStore::Done done) {
    store->PullSegments(1, 0, 1, absl::MakeSpan(short_buffer), std::move(done));
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("buffer"));
}

TEST(ShardedParameterStoreTest, RankZerosInitialParametersLandOnEveryShard) {
  auto servers = StartServers(3, 1);
  auto store = MakeSharded(Addresses(servers), "only");
  const std::vector<float> initial = Initial(0);
  auto reg = store->Register(Signature(), initial);
  ASSERT_TRUE(reg.ok()) << reg.status();
  EXPECT_EQ(reg->rank, 0);
  EXPECT_EQ(reg->version, 0);
  EXPECT_TRUE(store->sent_initial_parameters());
  for (int s = 0; s < 3; ++s) {
    const ShardPart& part = store->plan().shards[s];
    std::vector<float> held(part.elements());
    auto v = server::Pull(servers[s]->domain(), 0, absl::Now() + absl::Seconds(5), absl::MakeSpan(held));
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(held, std::vector<float>(initial.begin() + part.flat_begin,
                                       initial.begin() + part.flat_end))
        << "shard " << s;
  }
  std::vector<float> pulled(kElements);
  auto v = store->Pull(0, absl::MakeSpan(pulled));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(pulled, initial);
  EXPECT_EQ(store->bytes_pulled(), kElements * 4);
  std::vector<float> grad(kElements, 0.5f);
  ASSERT_TRUE(store->Push(0, 1, grad).ok());
  EXPECT_EQ(store->bytes_pushed(), kElements * 4);
}

TEST(ShardedParameterStoreTest, AShardWithADifferentModelIsRefusedByName) {
  auto first = server::InProcessServer::Start(ServerOptions(1));
  ASSERT_TRUE(first.ok());
  auto other = server::InProcessServer::Start(
      ServerOptions(1), {{"other.weight", {5}, DType::kF32}}, std::vector<float>(5, 1.f));
  ASSERT_TRUE(other.ok());
  auto store = MakeSharded({(*first)->address(), (*other)->address()}, "w");
  auto reg = store->Register(Signature(), Initial(0));
  ASSERT_FALSE(reg.ok());
  EXPECT_EQ(reg.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(reg.status().message(),
              HasSubstr(absl::StrCat("shard 1 of 2 (", (*other)->address(), ")")));
  EXPECT_THAT(reg.status().message(), HasSubstr("other.weight"));
}

// Every shard must publish the same kind of version: parameters, or (a
// sum-only server) mean gradients. The store carries the shards' optimizer.
TEST(ShardedParameterStoreTest, ShardsOfAnotherOptimizerAreRefusedByName) {
  server::ParameterServerOptions none;
  none.optimizer.kind = "none";
  std::vector<std::unique_ptr<server::InProcessServer>> servers;
  for (const auto& options : {none, none, ServerOptions(1), none}) {
    auto server = server::InProcessServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    servers.push_back(std::move(server).value());
  }
  auto agreeing = MakeSharded({servers[0]->address(), servers[1]->address()}, "w");
  auto reg = agreeing->Register(Signature(), Initial(0));
  ASSERT_TRUE(reg.ok()) << reg.status();
  EXPECT_EQ(reg->optimizer, "none");
  auto mixed = MakeSharded({servers[2]->address(), servers[3]->address()}, "v");
  reg = mixed->Register(Signature(), Initial(0));
  EXPECT_EQ(reg.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string message(reg.status().message());
  EXPECT_THAT(message,
              HasSubstr(absl::StrCat("(", servers[3]->address(), ") runs --optimizer=none")));
  EXPECT_THAT(message, HasSubstr("start every shard with the same --optimizer"));
}

TEST(ShardedParameterStoreTest, EveryShardGivesTheFirstShardsRankOrRefuses) {
  auto servers = StartServers(2, 2);
  // Someone else already holds rank 0 on shard 1 only.
  auto plan = PlanShards(Signature(), 2);
  ASSERT_TRUE(plan.ok());
  ASSERT_TRUE(servers[1]->domain().Register("intruder", plan->shards[1].signature(), 0).ok());
  auto store = MakeSharded(Addresses(servers), "w");
  auto reg = store->Register(Signature(), Initial(0));
  ASSERT_FALSE(reg.ok());
  EXPECT_EQ(reg.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(reg.status().message(),
              HasSubstr(absl::StrCat("shard 1 of 2 (", servers[1]->address(), ")")));
}

// A job that shrinks: the members of an iteration are the ones every shard
// announced in its push replies, not every rank; shards that announce
// different ones are an error that names both.
TEST(ShardedParameterStoreTest, MembersAreWhatEveryShardAnnouncedAndMustAgree) {
  const std::vector<float> gradient(kElements, 0.5f);
  for (const bool both : {true, false}) {
    SCOPED_TRACE(both ? "rank 1 dropped on both shards" : "rank 1 dropped on shard 0 only");
    auto servers = StartServers(2, 2);
    auto w0 = MakeSharded(Addresses(servers), "w0", nullptr, 0);
    auto w1 = MakeSharded(Addresses(servers), "w1", nullptr, 1);
    ASSERT_TRUE(w0->Register(Signature(), Initial(0)).ok());
    ASSERT_TRUE(w1->Register(Signature(), Initial(1)).ok());
    ASSERT_TRUE(w0->Push(0, 1, gradient).ok());
    ASSERT_TRUE(w1->Push(0, 1, gradient).ok());
    auto members = w0->Members(1, 2);
    ASSERT_TRUE(members.ok()) << members.status();
    EXPECT_EQ(*members, (std::vector<int>{0, 1}));
    // Rank 1 is lost; rank 0's pushes of iteration 1 announce iteration 2's.
    ASSERT_TRUE(servers[0]->domain().DropWorker(1).ok());
    if (both) ASSERT_TRUE(servers[1]->domain().DropWorker(1).ok());
    ASSERT_TRUE(w0->Push(1, 1, gradient).ok());
    members = w0->Members(2, 2);
    if (both) {
      ASSERT_TRUE(members.ok()) << members.status();
      EXPECT_EQ(*members, (std::vector<int>{0}));
    } else {
      EXPECT_EQ(members.status().code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_THAT(members.status().message(),
                  HasSubstr(absl::StrCat("has ranks 0, shard 1 (", servers[1]->address(),
                                         ") ranks 0,1")));
    }
  }
}

TEST(ShardedParameterStoreTest, EachShardsMessagesHaveTheirOwnLanes) {
  auto servers = StartServers(2, 1);
  RecordingObserver observer;
  auto store = MakeSharded(Addresses(servers), "w", &observer);
  ASSERT_TRUE(store->Register(Signature(), Initial(0)).ok());
  std::vector<float> grad(kElements, 0.25f), params(kElements);
  ASSERT_TRUE(store->Push(0, 1, grad).ok());
  ASSERT_TRUE(store->WaitForVersion(1).ok());
  ASSERT_TRUE(store->Pull(1, absl::MakeSpan(params)).ok());
  std::vector<int> pushes_per_shard(2, 0), pulls_per_shard(2, 0);
  for (const TimedEvent& e : observer.events()) {
    if (e.kind != EventKind::kPushMessage && e.kind != EventKind::kPullMessage) continue;
    ASSERT_GE(e.lane, RpcLane(0));
    const int shard = (e.lane - RpcLane(0)) / ShardedParameterStore::kRpcLanesPerShard;
    ASSERT_LT(shard, 2);
    if (e.step == 0 && e.kind == EventKind::kPushMessage) ++pushes_per_shard[shard];
    if (e.kind == EventKind::kPullMessage) ++pulls_per_shard[shard];
  }
  // 539 elements per shard in chunks of 100 (a.weight's pieces: 539 on shard
  // 0; 312 + 37 + 185 + 5 on shard 1): messages of at most 100 elements.
  EXPECT_GE(pushes_per_shard[0], 6);
  EXPECT_GE(pushes_per_shard[1], 6);
  EXPECT_EQ(pulls_per_shard[0], pushes_per_shard[0]);
  EXPECT_EQ(pulls_per_shard[1], pushes_per_shard[1]);
}

TEST(ShardedParameterStoreTest, RefusesNoOrRepeatedAddressesAndCallsBeforeRegister) {
  ShardedStoreOptions options;
  EXPECT_EQ(ShardedParameterStore::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.shard_addresses = {"127.0.0.1:1", "127.0.0.1:1"};
  auto repeated = ShardedParameterStore::Create(options);
  EXPECT_EQ(repeated.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(repeated.status().message(), HasSubstr("127.0.0.1:1 is listed twice"));
  options.shard_addresses = {"127.0.0.1:1", "127.0.0.1:2"};
  auto store = ShardedParameterStore::Create(options);
  ASSERT_TRUE(store.ok());
  std::vector<float> buffer(4);
  EXPECT_EQ((*store)->Push(0, 1, buffer).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*store)->Pull(0, absl::MakeSpan(buffer)).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace ps::worker
