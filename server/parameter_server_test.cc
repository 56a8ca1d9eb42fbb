#include "server/parameter_server.h"
#include "server/parameter_server_testing.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/fake_observer.h"
#include "common/optimizer/optimizer.h"
#include "common/timed_event.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::server {
namespace {

using ::testing::HasSubstr;

std::vector<ParamSpec> Signature() {
  return {{"fc.weight", {2, 3}, DType::kF32}, {"fc.bias", {2}, DType::kF32}};
}

std::vector<float> Initial() { return {1, 2, 3, 4, 5, 6, 0.5f, -0.5f}; }

class ParameterServerTest : public ::testing::Test {
 protected:
  std::unique_ptr<ParameterServer> MakeServer(int workers, int64_t chunk_elements = 4) {
    ParameterServerOptions options;
    options.num_workers = workers;
    options.chunk_elements = chunk_elements;
    options.optimizer.sgd.lr = 1.f;
    auto server = ParameterServer::Create(options, Signature(), Initial(), &device_);
    EXPECT_TRUE(server.ok()) << server.status();
    return std::move(server).value();
  }

  std::vector<float> Params(ParameterServer& server) {
    std::vector<float> out(8);
    auto v = Pull(server, 0, absl::InfiniteFuture(), absl::MakeSpan(out));
    EXPECT_TRUE(v.ok()) << v.status();
    return out;
  }

  CpuDevice device_{0, 1};
};

// Pushes a whole gradient of value `g` for worker `rank`.
void PushAll(ParameterServer& server, int rank, int64_t iteration, float g, int64_t samples) {
  for (int key = 0; key < 2; ++key) {
    const int64_t n = key == 0 ? 6 : 2;
    for (int64_t c = 0; c < ChunkCount(n, 4); ++c) {
      const int64_t len = std::min<int64_t>(4, n - c * 4);
      std::vector<float> grad(len, g);
      ASSERT_TRUE(Push(server, rank, iteration, key, c, samples, grad).ok());
    }
  }
}

TEST_F(ParameterServerTest, SumsWorkersAndScalesByGlobalBatch) {
  auto server = MakeServer(2);
  ASSERT_TRUE(server->Register("a", Signature()).ok());
  ASSERT_TRUE(server->Register("b", Signature()).ok());
  // 6 elements in chunks of 4: two chunks.
  EXPECT_EQ(server->ChunkLength(0, 1), 2);
  EXPECT_EQ(server->ChunkLength(0, 2), -1);
  PushAll(*server, 0, 0, 3.f, 2);
  EXPECT_EQ(server->version(), 0);  // waits for worker 1
  PushAll(*server, 1, 0, 5.f, 6);
  EXPECT_EQ(server->version(), 1);
  // lr 1, gradient sum 8 over 8 samples: every parameter drops by 1.
  std::vector<float> expected = Initial();
  for (float& x : expected) x -= 1.f;
  EXPECT_EQ(Params(*server), expected);
}

TEST_F(ParameterServerTest, PullWaitsForTheVersion) {
  auto server = MakeServer(1);
  ASSERT_TRUE(server->Register("a", Signature()).ok());
  std::vector<float> out(8);
  EXPECT_EQ(Pull(*server, 1, absl::Now() + absl::Milliseconds(20), absl::MakeSpan(out))
                .status()
                .code(),
            absl::StatusCode::kDeadlineExceeded);
  std::thread pusher([&] { PushAll(*server, 0, 0, 1.f, 1); });
  auto version = Pull(*server, 1, absl::Now() + absl::Seconds(10), absl::MakeSpan(out));
  pusher.join();
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_EQ(*version, 1);
}

// Chunks of Initial() in the layout MakeServer's chunk size 4 gives: key 0
// in chunks [0, 4) and [4, 6), key 1 in one chunk.
std::vector<ChunkData> InitialChunks(const std::vector<float>& values) {
  return {{0, 0, absl::MakeConstSpan(values).subspan(0, 4)},
          {0, 1, absl::MakeConstSpan(values).subspan(4, 2)},
          {1, 0, absl::MakeConstSpan(values).subspan(6, 2)}};
}

TEST_F(ParameterServerTest, RankZeroSendsTheInitialParametersWhenTheServerHasNone) {
  ParameterServerOptions options;
  options.num_workers = 2;
  options.chunk_elements = 4;
  auto created = ParameterServer::Create(options, &device_);
  ASSERT_TRUE(created.ok()) << created.status();
  ParameterServer& server = **created;
  // The first worker to register states the signature, whatever its rank;
  // only rank 0 is asked for the values.
  auto b = server.Register("b", Signature(), /*requested_rank=*/1);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_FALSE(b->send_initial_parameters);
  EXPECT_EQ(server.signature(), Signature());
  auto a = server.Register("a", Signature());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->rank, 0);
  EXPECT_TRUE(a->send_initial_parameters);

  // Version 0 does not exist until every chunk is there.
  std::vector<float> out(8);
  auto early = Pull(server, 0, absl::Now() + absl::Milliseconds(10), absl::MakeSpan(out));
  EXPECT_EQ(early.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(early.status().message()), HasSubstr("incomplete"));
  std::vector<float> two(2, 1.f);
  EXPECT_EQ(Push(server, 0, 0, 1, 0, 1, two).code(), absl::StatusCode::kFailedPrecondition);

  const std::vector<float> initial = Initial();
  const std::vector<ChunkData> chunks = InitialChunks(initial);
  EXPECT_EQ(InitializeChunks(server, 1, chunks).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(InitializeChunks(server, 3, chunks).code(), absl::StatusCode::kNotFound);
  // A bad message adds nothing, a good one its chunks, a repeat is refused.
  const std::vector<float> with_nan = {1.f, NAN};
  const std::vector<ChunkData> bad = {chunks[0], {1, 0, with_nan}};
  EXPECT_EQ(InitializeChunks(server, 0, bad).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(InitializeChunks(server, 0, {chunks[0], chunks[1]}).ok());
  EXPECT_FALSE(server.initialized());
  EXPECT_EQ(InitializeChunks(server, 0, {chunks[0]}).code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(InitializeChunks(server, 0, {chunks[2]}).ok());
  EXPECT_TRUE(server.initialized());
  EXPECT_EQ(Params(server), Initial());
  EXPECT_EQ(InitializeChunks(server, 0, {chunks[2]}).code(), absl::StatusCode::kFailedPrecondition);
  // A restarted rank 0 is not asked again once they are complete.
  EXPECT_FALSE(server.Register("a", Signature())->send_initial_parameters);
}

TEST_F(ParameterServerTest, NamedInitialTensorsAreMatchedToTheSignatureByName) {
  ParameterServerOptions options;
  const std::vector<float> initial = Initial();
  // Out of order, with a buffer the signature does not name.
  std::vector<NamedTensor> named = {{"fc.bias", {2}, {0.5f, -0.5f}},
                                    {"bn.running_mean", {3}, {0, 0, 0}},
                                    {"fc.weight", {2, 3}, {1, 2, 3, 4, 5, 6}}};
  auto server = ParameterServer::CreateFromNamedTensors(options, named, &device_);
  ASSERT_TRUE(server.ok()) << server.status();
  auto reg = (*server)->Register("a", Signature());
  ASSERT_TRUE(reg.ok()) << reg.status();
  EXPECT_FALSE(reg->send_initial_parameters);
  EXPECT_EQ(Params(**server), Initial());

  named.erase(named.begin());  // no fc.bias
  auto missing = ParameterServer::CreateFromNamedTensors(options, named, &device_);
  ASSERT_TRUE(missing.ok());
  auto refused = (*missing)->Register("a", Signature());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("no 'fc.bias'"));
  EXPECT_TRUE((*missing)->signature().empty());  // nothing adopted

  named.push_back({"fc.bias", {1, 2}, {0.5f, -0.5f}});
  auto reshaped = ParameterServer::CreateFromNamedTensors(options, named, &device_);
  ASSERT_TRUE(reshaped.ok());
  EXPECT_THAT(std::string((*reshaped)->Register("a", Signature()).status().message()),
              HasSubstr("'fc.bias' has shape [1, 2] on the server but [2] on the worker"));

  EXPECT_EQ(ParameterServer::CreateFromNamedTensors(options, {{"x", {2}, {1.f}}}, &device_)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParameterServer::CreateFromNamedTensors(options, {{"x", {1}, {INFINITY}}}, &device_)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ParameterServerTest, WorkersStateTheStepsPerEpochOfTheSchedule) {
  ParameterServerOptions options;
  options.num_workers = 2;
  options.chunk_elements = 4;  // PushAll's layout
  options.optimizer.sgd.lr = 1.f;
  options.optimizer.schedule.unit = LrSchedule::Unit::kEpochs;
  options.optimizer.schedule.step_size = 1;
  options.optimizer.schedule.gamma = 0.5f;
  auto created = ParameterServer::Create(options, Signature(), Initial(), &device_);
  ASSERT_TRUE(created.ok()) << created.status();
  ParameterServer& server = **created;
  auto none = server.Register("a", Signature(), -1, /*steps_per_epoch=*/0);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(none.status().message()), HasSubstr("states no steps per epoch"));
  ASSERT_TRUE(server.Register("a", Signature(), -1, 2).ok());
  auto other = server.Register("b", Signature(), -1, 3);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(other.status().message()),
              HasSubstr("has 3 steps per epoch but the job has 2"));
  ASSERT_TRUE(server.Register("b", Signature(), -1, 2).ok());
  // Two updates at lr 1, then one at lr 0.5: gradients of 1 per sample.
  for (int64_t it = 0; it < 3; ++it) {
    PushAll(server, 0, it, 1.f, 1);
    PushAll(server, 1, it, 1.f, 1);
  }
  ASSERT_EQ(server.version(), 3);
  std::vector<float> params(8);
  ASSERT_TRUE(Pull(server, 3, absl::InfiniteFuture(), absl::MakeSpan(params)).ok());
  for (int i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(params[i], Initial()[i] - 2.5f) << i;
}

TEST_F(ParameterServerTest, SumsInRankOrderWhateverTheArrivalOrder) {
  // Values whose float sum depends on the order: (1e8 + 1) - 1e8 = 0 but
  // (1e8 - 1e8) + 1 = 1. Rank order is (g0 + g1) + g2.
  const float g[3] = {1e8f, 1.f, -1e8f};
  std::vector<int> order = {0, 1, 2};
  std::vector<float> first;
  int runs = 0;
  do {
    ParameterServerOptions options;
    options.num_workers = 3;
    options.chunk_elements = 4;
    options.optimizer.sgd.lr = 1.f;
    auto created = ParameterServer::Create(options, Signature(), std::vector<float>(8, 0.f),
                                           &device_);
    ASSERT_TRUE(created.ok()) << created.status();
    ParameterServer& server = **created;
    for (int r = 0; r < 3; ++r) {
      ASSERT_TRUE(server.Register(absl::StrCat("w", r), Signature(), r).ok());
    }
    int64_t most_held = 0;
    for (int r : order) {
      PushAll(server, r, 0, g[r], 1);
      most_held = std::max(most_held, server.held_elements());
    }
    EXPECT_EQ(server.held_elements(), 0);
    // Held only what arrived ahead of a lower rank.
    if (order == std::vector<int>{0, 1, 2}) {
      EXPECT_EQ(most_held, 0);
    }
    if (order == std::vector<int>{2, 1, 0}) {
      EXPECT_EQ(most_held, 16);
    }
    ASSERT_EQ(server.version(), 1);
    const std::vector<float> params = Params(server);
    if (first.empty()) {
      first = params;
      // lr 1 over 3 samples: -((1e8 + 1) - 1e8) / 3 = 0 in float.
      for (float p : params) EXPECT_EQ(p, 0.f);
    } else {
      EXPECT_EQ(params, first) << "arrival order " << order[0] << order[1] << order[2];
    }
    ++runs;
  } while (std::next_permutation(order.begin(), order.end()));
  EXPECT_EQ(runs, 6);
}

TEST_F(ParameterServerTest, AWorkerCountOutsideOneTo2To22IsRefused) {
  for (const int workers : {0, kMaxWorkers + 1}) {
    ParameterServerOptions options;
    options.num_workers = workers;
    EXPECT_EQ(ParameterServer::Create(options, &device_).status().code(),
              absl::StatusCode::kInvalidArgument)
        << workers;
  }
}

TEST_F(ParameterServerTest, RegistrationErrors) {
  auto server = MakeServer(1);
  EXPECT_EQ(server->Register("", Signature()).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto sig = Signature();
  sig[1].shape = {3};
  auto mismatch = server->Register("a", sig);
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(mismatch.status().message()),
              HasSubstr("'fc.bias' has shape [2] on the server but [3] on the worker"));
  sig = Signature();
  sig[0].name = "conv.weight";
  EXPECT_THAT(std::string(server->Register("a", sig).status().message()),
              HasSubstr("'fc.weight' on the server but 'conv.weight'"));
  ASSERT_TRUE(server->Register("a", Signature()).ok());
  EXPECT_EQ(server->Register("a", Signature())->rank, 0);  // re-registration
  EXPECT_EQ(server->Register("b", Signature()).status().code(),
            absl::StatusCode::kResourceExhausted);
}

// Shapes come from the wire: a product past int64, a model of 2^40
// elements, or one this machine's memory can never hold is refused with its
// sizes before anything is allocated, and an honest worker still registers.
TEST_F(ParameterServerTest, SignaturesTooLargeAreRefusedBeforeAnythingIsAllocated) {
  ParameterServerOptions options;
  options.num_workers = 1;
  auto server = ParameterServer::Create(options, &device_);
  ASSERT_TRUE(server.ok());
  const int64_t big = int64_t{1} << 39;
  const auto overflow =
      (*server)->Register("a", {{"w", {int64_t{1} << 32, int64_t{1} << 32}, DType::kF32}});
  EXPECT_EQ(overflow.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(overflow.status().message()), HasSubstr("'w' has shape ["));
  const auto too_many =
      (*server)->Register("a", {{"a", {big}, DType::kF32}, {"b", {big}, DType::kF32}});
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(too_many.status().message()), HasSubstr("2^40 parameters or more"));
  const auto unfit = (*server)->Register("a", {{"w", {big}, DType::kF32}});  // 6 TiB with its sums
  EXPECT_EQ(unfit.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(unfit.status().message()), HasSubstr("MiB on this server"));
  EXPECT_FALSE((*server)->initialized());
  const auto honest = (*server)->Register("a", Signature());
  ASSERT_TRUE(honest.ok()) << honest.status();
  EXPECT_EQ(honest->rank, 0);
  EXPECT_EQ((*server)->num_parameters(), 8);
}

TEST_F(ParameterServerTest, RequestedRanks) {
  auto server = MakeServer(2);
  auto b = server->Register("b", Signature(), /*requested_rank=*/1);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->rank, 1);
  auto taken = server->Register("c", Signature(), 1);
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(taken.status().message()), HasSubstr("already held by worker 'b'"));
  EXPECT_EQ(server->Register("c", Signature(), 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(server->Register("a", Signature())->rank, 0);  // the free one
  EXPECT_EQ(server->Register("b", Signature(), 1)->rank, 1);  // restart keeps it
}

TEST_F(ParameterServerTest, BadPushesAreRefusedAndChangeNothing) {
  auto server = MakeServer(1);
  ASSERT_TRUE(server->Register("a", Signature()).ok());
  std::vector<float> four(4, 1.f), two(2, 1.f);
  // A good first chunk, then every kind of bad push.
  ASSERT_TRUE(Push(*server, 0, 0, 0, 0, 3, four).ok());
  struct Case {
    const char* what;
    absl::Status status;
    absl::StatusCode code;
    const char* message;
  };
  std::vector<float> with_nan = {1.f, NAN};
  const Case cases[] = {
      {"unknown worker", Push(*server, 3, 0, 0, 1, 3, two), absl::StatusCode::kNotFound,
       "unregistered worker rank 3"},
      {"unknown key", Push(*server, 0, 0, 7, 0, 3, two), absl::StatusCode::kOutOfRange,
       "key 7 out of range"},
      {"chunk out of range", Push(*server, 0, 0, 0, 2, 3, two), absl::StatusCode::kOutOfRange,
       "chunk 2 of key 'fc.weight' out of range"},
      {"wrong length", Push(*server, 0, 0, 0, 1, 3, four), absl::StatusCode::kInvalidArgument,
       "needs 2 elements, got 4"},
      {"duplicate", Push(*server, 0, 0, 0, 0, 3, four), absl::StatusCode::kAlreadyExists,
       "already pushed"},
      {"stale iteration", Push(*server, 0, 5, 0, 1, 3, two), absl::StatusCode::kFailedPrecondition,
       "iteration 5 but the server is at iteration 0"},
      {"sample count changes", Push(*server, 0, 0, 0, 1, 4, two),
       absl::StatusCode::kFailedPrecondition, "claims 4 samples"},
      {"negative sample count", Push(*server, 0, 0, 0, 1, -1, two),
       absl::StatusCode::kInvalidArgument, "claims -1 samples; 0 to"},
      {"NaN", Push(*server, 0, 0, 1, 0, 3, with_nan), absl::StatusCode::kInvalidArgument,
       "non-finite"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(c.status.code(), c.code) << c.what << ": " << c.status;
    EXPECT_THAT(std::string(c.status.message()), HasSubstr(c.message)) << c.what;
  }
  // Finish the iteration: the update reflects only the good pushes.
  ASSERT_TRUE(Push(*server, 0, 0, 0, 1, 3, two).ok());
  ASSERT_TRUE(Push(*server, 0, 0, 1, 0, 3, two).ok());
  EXPECT_EQ(server->version(), 1);
  std::vector<float> expected = Initial();
  for (float& x : expected) x -= 1.f / 3.f;
  const std::vector<float> params = Params(*server);
  for (int i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(params[i], expected[i]) << i;
}

TEST_F(ParameterServerTest, ReportsEachPushMessageEachChunksUpdateAndEachPull) {
  FakeClock clock(5000);
  RecordingObserver observer;
  ParameterServerOptions options;
  options.num_workers = 2;
  options.chunk_elements = 4;  // fc.weight: 2 chunks, fc.bias: 1
  options.optimizer.sgd.lr = 1.f;
  options.observer = &observer;
  options.clock = &clock;
  auto created = ParameterServer::Create(options, Signature(), Initial(), &device_);
  ASSERT_TRUE(created.ok()) << created.status();
  ParameterServer& server = **created;
  ASSERT_TRUE(server.Register("a", Signature()).ok());
  ASSERT_TRUE(server.Register("b", Signature()).ok());

  // A refused push is not reported.
  EXPECT_FALSE(Push(server, 0, 1, 0, 0, 8, std::vector<float>(4, 1.f)).ok());
  EXPECT_TRUE(observer.events().empty());

  // Worker 1 first: one push message per chunk, then worker 0's, each of
  // which completes its chunk: the chunk's update follows its push.
  PushAll(server, 1, 0, 1.f, 8);
  clock.Advance(100);
  PushAll(server, 0, 0, 2.f, 8);
  std::vector<TimedEvent> events = observer.events();
  std::vector<std::string> names = observer.names();
  ASSERT_EQ(events.size(), 3u + 2 * 3);
  const std::vector<std::string> tensors = {"fc.weight", "fc.weight", "fc.bias"};
  const std::vector<int64_t> bytes = {16, 8, 8};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(events[i].kind, EventKind::kServerPush) << i;
    EXPECT_EQ(events[i].lane, ServerPushLane(1)) << i;
    EXPECT_EQ(events[i].step, 0) << i;
    EXPECT_EQ(names[i], tensors[i]) << i;
    EXPECT_EQ(events[i].bytes, bytes[i]) << i;
    EXPECT_EQ(events[i].start_ns, 5000) << i;
    EXPECT_EQ(events[i].end_ns, events[i].start_ns) << i;
  }
  for (int c = 0; c < 3; ++c) {
    const int push = 3 + 2 * c, update = push + 1;
    EXPECT_EQ(events[push].kind, EventKind::kServerPush) << c;
    EXPECT_EQ(events[push].lane, ServerPushLane(0)) << c;
    EXPECT_EQ(events[push].step, 0) << c;
    EXPECT_EQ(names[push], tensors[c]) << c;
    EXPECT_EQ(events[push].bytes, bytes[c]) << c;
    EXPECT_EQ(events[push].start_ns, 5100) << c;
    EXPECT_EQ(events[update].kind, EventKind::kServerUpdate) << c;
    EXPECT_EQ(events[update].lane, kServerUpdateLane) << c;
    EXPECT_EQ(events[update].step, 0) << c;
    EXPECT_EQ(names[update], tensors[c]) << c;
    EXPECT_EQ(events[update].bytes, bytes[c]) << c;
    EXPECT_EQ(events[update].start_ns, 5100) << c;
  }
  EXPECT_EQ(server.version(), 1);

  // One pull message of two chunks; then the whole model at once.
  std::vector<float> bias(2), tail(2);
  const ChunkOut outs[] = {{1, 0, absl::MakeSpan(bias)},
                                            {0, 1, absl::MakeSpan(tail)}};
  ASSERT_TRUE(PullChunks(server, 1, absl::InfiniteFuture(), outs).ok());
  Params(server);
  events = observer.events();
  names = observer.names();
  ASSERT_EQ(events.size(), 11u);
  EXPECT_EQ(events[9].kind, EventKind::kServerPull);
  EXPECT_EQ(events[9].lane, kServerPullLane);
  EXPECT_EQ(events[9].step, 1);
  EXPECT_EQ(names[9], "fc.bias");
  EXPECT_EQ(events[9].bytes, 16);
  EXPECT_EQ(events[10].kind, EventKind::kServerPull);
  EXPECT_EQ(names[10], "fc.weight");
  EXPECT_EQ(events[10].bytes, 32);
}

TEST_F(ParameterServerTest, AnObserverNeedsAClock) {
  RecordingObserver observer;
  ParameterServerOptions options;
  options.observer = &observer;
  options.clock = nullptr;
  EXPECT_EQ(ParameterServer::Create(options, &device_).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The byte form reads a chunk from pieces cut anywhere (an element split
// across two), with the Span form's checks and all-or-nothing rule.
TEST_F(ParameterServerTest, PushChunkBytesReadsPiecesCutAnywhere) {
  auto server = MakeServer(1);
  ASSERT_TRUE(server->Register("a", Signature()).ok());
  const std::vector<float> w0 = {1, 1, 1, 1}, w1 = {2, 2}, b = {4, 4};
  const std::string bytes = std::string(reinterpret_cast<const char*>(w0.data()), 16) +
                            std::string(reinterpret_cast<const char*>(w1.data()), 8) +
                            std::string(reinterpret_cast<const char*>(b.data()), 8);
  const absl::string_view all(bytes);
  // Chunk (0, 0) in three pieces, the first split inside element 1.
  const absl::string_view c00[] = {all.substr(0, 5), all.substr(5, 10), all.substr(15, 1)};
  const absl::string_view c01[] = {all.substr(16, 8)};
  const absl::string_view c10[] = {all.substr(24, 3), all.substr(27, 5)};
  const absl::string_view short_piece[] = {all.substr(24, 7)};
  const float nan = NAN;
  const absl::string_view with_nan[] = {all.substr(24, 4),
                                        absl::string_view(reinterpret_cast<const char*>(&nan), 4)};

  absl::Status s = server->PushChunkBytes(0, 0, 1, {{0, 0, c00}, {1, 0, short_piece}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("needs 2 elements, got 7 bytes"));
  s = server->PushChunkBytes(0, 0, 1, {{0, 0, c00}, {1, 0, with_nan}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("element 1 of 'fc.bias' is nan"));
  EXPECT_EQ(server->PushChunkBytes(0, 0, 1, {{0, 0, c00}, {0, 0, c00}}).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(server->version(), 0);  // nothing was added

  ASSERT_TRUE(server->PushChunkBytes(0, 0, 1, {{0, 0, c00}, {0, 1, c01}, {1, 0, c10}}).ok());
  EXPECT_EQ(server->version(), 1);
  EXPECT_EQ(Params(*server), (std::vector<float>{0, 1, 2, 3, 3, 4, -3.5f, -4.5f}));
}

// A view of a version stays unchanged while held, whatever updates follow;
// once let go, the next update writes in place again.
TEST_F(ParameterServerTest, PullChunkViewsStayUnchangedWhileHeld) {
  auto server = MakeServer(1);
  ASSERT_TRUE(server->Register("a", Signature()).ok());
  EXPECT_TRUE(server->HasVersion(0));
  EXPECT_FALSE(server->HasVersion(1));
  const ParameterServer::ChunkId ids[] = {{1, 0}, {0, 1}};
  auto views = server->PullChunkViews(0, absl::InfiniteFuture(), ids);
  ASSERT_TRUE(views.ok()) << views.status();
  EXPECT_EQ(views->version, 0);
  ASSERT_EQ(views->chunks.size(), 2u);
  EXPECT_EQ(std::vector<float>(views->chunks[0].begin(), views->chunks[0].end()),
            (std::vector<float>{0.5f, -0.5f}));
  EXPECT_EQ(std::vector<float>(views->chunks[1].begin(), views->chunks[1].end()),
            (std::vector<float>{5, 6}));
  const float* held = views->chunks[0].data();

  PushAll(*server, 0, 0, 1.f, 1);  // version 1: every parameter drops by 1
  EXPECT_EQ(server->version(), 1);
  EXPECT_EQ(views->chunks[0][0], 0.5f);  // the held version is untouched
  EXPECT_EQ(views->chunks[1][1], 6.f);
  EXPECT_EQ(Params(*server)[6], -0.5f);

  views = server->PullChunkViews(1, absl::InfiniteFuture(), ids);
  ASSERT_TRUE(views.ok());
  EXPECT_NE(views->chunks[0].data(), held);  // the update wrote a fresh buffer
  EXPECT_EQ(views->chunks[0][0], -0.5f);
  const float* current = views->chunks[0].data();
  *views = ParameterServer::ChunkViews();  // let go
  PushAll(*server, 0, 1, 1.f, 1);
  views = server->PullChunkViews(2, absl::InfiniteFuture(), ids);
  ASSERT_TRUE(views.ok());
  // Into the buffer of two versions ago, which nobody holds: no allocation.
  EXPECT_EQ(views->chunks[0].data(), held);
  EXPECT_EQ(views->chunks[0][0], -1.5f);
  // Version 1 is still there for an exact pull, in its own buffer.
  auto exact = server->PullChunkViews(1, absl::InfiniteFuture(), ids, /*exact=*/true);
  ASSERT_TRUE(exact.ok()) << exact.status();
  EXPECT_EQ(exact->version, 1);
  EXPECT_EQ(exact->chunks[0].data(), current);
  EXPECT_EQ(exact->chunks[0][0], -0.5f);
  EXPECT_EQ(exact->chunks[1][1], 5.f);

  const ParameterServer::ChunkId bad[] = {{1, 1}};
  EXPECT_EQ(server->PullChunkViews(0, absl::InfiniteFuture(), bad).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(server->PullChunkViews(9, absl::Now() + absl::Milliseconds(10), ids).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

// The values of a view, for comparing.
std::vector<float> Values(absl::Span<const float> view) {
  return std::vector<float>(view.begin(), view.end());
}

// A chunk is applied and published as soon as both workers have pushed it,
// while the server's version waits for the last chunk.
TEST_F(ParameterServerTest, PublishesEachChunkOnceEveryWorkerHasPushedIt) {
  auto server = MakeServer(2);  // lr 1; fc.weight in chunks of 4 and 2, fc.bias in one
  ASSERT_TRUE(server->Register("a", Signature()).ok());
  ASSERT_TRUE(server->Register("b", Signature()).ok());
  const ParameterServer::ChunkId a[] = {{0, 0}};  // chunk A: fc.weight[0, 4)
  const ParameterServer::ChunkId b[] = {{1, 0}};  // chunk B: fc.bias
  const ParameterServer::ChunkId both[] = {{0, 0}, {1, 0}};
  ASSERT_TRUE(Push(*server, 0, 0, 0, 0, 2, std::vector<float>(4, 3.f)).ok());
  EXPECT_FALSE(server->HasChunks(1, a));  // worker 1's part is missing
  ASSERT_TRUE(Push(*server, 1, 0, 0, 0, 6, std::vector<float>(4, 5.f)).ok());

  // Chunk A is at version 1, chunk B (and the server) still at 0.
  EXPECT_EQ(server->version(), 0);
  EXPECT_FALSE(server->HasVersion(1));
  EXPECT_TRUE(server->HasChunks(1, a));
  EXPECT_FALSE(server->HasChunks(1, b));
  EXPECT_FALSE(server->HasChunks(1, both));
  EXPECT_TRUE(server->HasChunks(0, both));
  EXPECT_FALSE(server->HasChunks(1, {}));  // an empty request: the server's version
  const ParameterServer::ChunkId unknown[] = {{0, 0}, {7, 0}};
  EXPECT_TRUE(server->HasChunks(1, unknown));  // answered at once, with its error

  // A at version 1 comes at once (a deadline already past), with the step:
  // lr 1, gradient sum 3 + 5 = 8 over 2 + 6 samples: every element drops by 1.
  auto views = server->PullChunkViews(1, absl::InfinitePast(), a);
  ASSERT_TRUE(views.ok()) << views.status();
  EXPECT_EQ(views->version, 1);
  EXPECT_EQ(Values(views->chunks[0]), (std::vector<float>{0, 1, 2, 3}));
  std::vector<float> copied(4);
  const ChunkOut out[] = {{0, 0, absl::MakeSpan(copied)}};
  EXPECT_EQ(*PullChunks(*server, 1, absl::InfinitePast(), out), 1);
  EXPECT_EQ(copied, (std::vector<float>{0, 1, 2, 3}));
  // A and B together at version 0: the smallest of their versions.
  views = server->PullChunkViews(0, absl::InfinitePast(), both);
  ASSERT_TRUE(views.ok()) << views.status();
  EXPECT_EQ(views->version, 0);
  EXPECT_EQ(Values(views->chunks[0]), (std::vector<float>{0, 1, 2, 3}));
  EXPECT_EQ(Values(views->chunks[1]), (std::vector<float>{0.5f, -0.5f}));
  // B at version 1 times out, naming B and its version.
  for (absl::Status s :
       {server->PullChunkViews(1, absl::Now() + absl::Milliseconds(20), both).status(),
        PullChunks(*server, 1, absl::Now() + absl::Milliseconds(20),
                           {{1, 0, absl::MakeSpan(copied).subspan(0, 2)}})
            .status()}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("version 1 of chunk 0 of 'fc.bias'")) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("the chunk is at version 0")) << s;
  }
  EXPECT_EQ(server->WaitForVersion(1, absl::Now() + absl::Milliseconds(10)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  // A chunk that does not exist is refused without waiting for the version.
  EXPECT_EQ(server->PullChunkViews(1, absl::InfiniteFuture(), unknown).status().code(),
            absl::StatusCode::kOutOfRange);

  // A repeat of A, now applied, is refused and changes nothing; so is a push
  // for the next iteration, which chunk A has reached but the server not.
  absl::Status repeat = Push(*server, 0, 0, 0, 0, 2, std::vector<float>(4, 100.f));
  EXPECT_EQ(repeat.code(), absl::StatusCode::kAlreadyExists) << repeat;
  EXPECT_THAT(std::string(repeat.message()), HasSubstr("already pushed"));
  EXPECT_EQ(Push(*server, 1, 1, 0, 0, 6, std::vector<float>(4, 100.f)).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(*PullChunks(*server, 1, absl::InfinitePast(), out), 1);
  EXPECT_EQ(copied, (std::vector<float>{0, 1, 2, 3}));

  // The other chunks complete version 1; a pull of B waiting meanwhile gets it.
  absl::StatusOr<ParameterServer::ChunkViews> waited;
  std::thread puller(
      [&] { waited = server->PullChunkViews(1, absl::Now() + absl::Seconds(10), b); });
  for (int rank = 0; rank < 2; ++rank) {
    const int64_t samples = rank == 0 ? 2 : 6;
    const float g = rank == 0 ? 3.f : 5.f;
    ASSERT_TRUE(Push(*server, rank, 0, 0, 1, samples, std::vector<float>(2, g)).ok());
    ASSERT_TRUE(Push(*server, rank, 0, 1, 0, samples, std::vector<float>(2, g)).ok());
  }
  puller.join();
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_EQ(waited->version, 1);
  EXPECT_EQ(Values(waited->chunks[0]), (std::vector<float>{-0.5f, -1.5f}));
  EXPECT_EQ(server->version(), 1);
  EXPECT_TRUE(server->HasVersion(1));
  EXPECT_TRUE(server->HasChunks(1, both));
  std::vector<float> expected = Initial();
  for (float& x : expected) x -= 1.f;
  EXPECT_EQ(Params(*server), expected);
  // The next iteration takes pushes again, chunk A's included.
  EXPECT_TRUE(Push(*server, 0, 1, 0, 0, 2, std::vector<float>(4, 3.f)).ok());
}

// Before version 0 exists every pull waits for it; once the signature is
// known, a chunk that does not exist is refused at once.
TEST_F(ParameterServerTest, HasChunksBeforeTheInitialParameters) {
  ParameterServerOptions options;
  options.chunk_elements = 4;
  auto created = ParameterServer::Create(options, &device_);
  ASSERT_TRUE(created.ok()) << created.status();
  ParameterServer& server = **created;
  const ParameterServer::ChunkId good[] = {{1, 0}};
  const ParameterServer::ChunkId bad[] = {{1, 3}};
  EXPECT_FALSE(server.HasChunks(0, good));
  EXPECT_FALSE(server.HasChunks(0, bad));  // nothing is known yet: it would wait
  absl::Status s = server.PullChunkViews(0, absl::Now() + absl::Milliseconds(10), bad).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(s.message()), HasSubstr("not known (no worker has registered)"));

  ASSERT_TRUE(server.Register("a", Signature()).ok());
  EXPECT_FALSE(server.HasChunks(0, good));
  EXPECT_TRUE(server.HasChunks(0, bad));
  EXPECT_EQ(server.PullChunkViews(0, absl::InfiniteFuture(), bad).status().code(),
            absl::StatusCode::kOutOfRange);
  s = server.PullChunkViews(0, absl::Now() + absl::Milliseconds(10), good).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(s.message()), HasSubstr("incomplete"));
  const std::vector<float> initial = Initial();
  ASSERT_TRUE(InitializeChunks(server, 0, InitialChunks(initial)).ok());
  EXPECT_TRUE(server.HasChunks(0, good));
  auto views = server.PullChunkViews(0, absl::InfinitePast(), good);
  ASSERT_TRUE(views.ok()) << views.status();
  EXPECT_EQ(Values(views->chunks[0]), (std::vector<float>{0.5f, -0.5f}));
}

// Copy on write per chunk: a view held across its chunk's update keeps the
// old values and costs that chunk's copy; chunks not viewed, or no longer
// viewed, are written in place.
TEST_F(ParameterServerTest, AnUpdateCopiesOnlyTheChunksStillViewed) {
  auto server = MakeServer(2);
  ASSERT_TRUE(server->Register("a", Signature()).ok());
  ASSERT_TRUE(server->Register("b", Signature()).ok());
  const ParameterServer::ChunkId a[] = {{0, 0}}, b[] = {{1, 0}}, c[] = {{0, 1}};
  const ParameterServer::ChunkId a_and_b[] = {{0, 0}, {1, 0}};
  auto pull = [&](int64_t version, absl::Span<const ParameterServer::ChunkId> ids) {
    auto views = server->PullChunkViews(version, absl::InfinitePast(), ids);
    EXPECT_TRUE(views.ok()) << views.status();
    return std::move(views).value();
  };
  // Pushes chunk `id` of iteration `it` from both workers: lr 1, one sample
  // each, gradients 1: the chunk drops by 1.
  auto push_both = [&](int64_t it, const ParameterServer::ChunkId& id) {
    const int64_t n = server->ChunkLength(id.key, id.chunk);
    for (int rank = 0; rank < 2; ++rank) {
      ASSERT_TRUE(Push(*server, rank, it, id.key, id.chunk, 1, std::vector<float>(n, 1.f)).ok());
    }
  };

  ParameterServer::ChunkViews held = pull(0, a_and_b);
  const float* const a0 = held.chunks[0].data();
  const float* const b0 = held.chunks[1].data();
  const float* const c0 = pull(0, c).chunks[0].data();  // let go at once

  // 1. A's and C's first updates write fresh buffers (there is no
  //    previous one yet); B (viewed, not updated) stays where it is.
  push_both(0, a[0]);
  push_both(0, c[0]);
  EXPECT_EQ(Values(held.chunks[0]), (std::vector<float>{1, 2, 3, 4}));
  ParameterServer::ChunkViews fresh = pull(1, a);
  EXPECT_NE(fresh.chunks[0].data(), a0);
  EXPECT_EQ(Values(fresh.chunks[0]), (std::vector<float>{0, 1, 2, 3}));
  EXPECT_EQ(pull(0, b).chunks[0].data(), b0);
  ParameterServer::ChunkViews c1 = pull(1, c);
  EXPECT_NE(c1.chunks[0].data(), c0);
  EXPECT_EQ(Values(c1.chunks[0]), (std::vector<float>{4, 5}));

  // 2. B's update, B still viewed: the view keeps B's old values, a new
  //    pull sees the new ones in a fresh buffer.
  push_both(0, b[0]);
  EXPECT_EQ(server->version(), 1);
  EXPECT_EQ(Values(held.chunks[1]), (std::vector<float>{0.5f, -0.5f}));
  ParameterServer::ChunkViews b1 = pull(1, b);
  EXPECT_NE(b1.chunks[0].data(), b0);
  EXPECT_EQ(Values(b1.chunks[0]), (std::vector<float>{-0.5f, -1.5f}));
  EXPECT_EQ(Params(*server), (std::vector<float>{0, 1, 2, 3, 4, 5, -0.5f, -1.5f}));

  // 3. Once every view is let go, the next updates write into the buffers
  //    of two versions ago (no allocation); a copy of the keep_alive alone
  //    keeps its chunks as they were. An exact view of a previous version
  //    held across the next update makes that update allocate.
  const float* const b1_data = b1.chunks[0].data();
  std::shared_ptr<const void> only_b1 = b1.keep_alive;
  held = fresh = b1 = c1 = ParameterServer::ChunkViews();
  for (const auto& id : {a[0], b[0], c[0]}) push_both(1, id);
  EXPECT_EQ(server->version(), 2);
  EXPECT_EQ(pull(2, a).chunks[0].data(), a0);
  EXPECT_EQ(pull(2, c).chunks[0].data(), c0);
  EXPECT_EQ(b1_data[0], -0.5f);  // still held through the copied keep_alive
  EXPECT_EQ(pull(2, b).chunks[0].data(), b0);
  EXPECT_EQ(Params(*server), (std::vector<float>{-1, 0, 1, 2, 3, 4, -1.5f, -2.5f}));
  only_b1.reset();
}

// A session is the credential of one registration of one rank: another
// rank's, an older registration's and another server process's are each
// refused with their own code.
TEST_F(ParameterServerTest, SessionsNameTheirRankAndRegistration) {
  auto server = MakeServer(2);
  auto a = server->Register("a", Signature());
  auto b = server->Register("b", Signature());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(absl::StartsWith(a->session, server->incarnation()));
  EXPECT_NE(a->session, b->session);
  EXPECT_TRUE(server->CheckSession(a->rank, a->session).ok());
  EXPECT_TRUE(server->CheckSession(b->rank, b->session).ok());
  EXPECT_EQ(server->CheckSession(a->rank, b->session).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(server->CheckSession(a->rank, "").code(), absl::StatusCode::kAborted);
  EXPECT_EQ(server->CheckSession(a->rank, "0123456789abcdef-00").code(),
            absl::StatusCode::kAborted);
  // The same incarnation with a guessed secret is somebody else.
  EXPECT_EQ(server->CheckSession(a->rank, absl::StrCat(server->incarnation(), "-00")).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(server->CheckSession(7, a->session).code(), absl::StatusCode::kNotFound);
  // The incarnation alone (calls that act as no rank).
  EXPECT_TRUE(server->CheckIncarnation(b->session).ok());
  EXPECT_EQ(server->CheckIncarnation("0123456789abcdef-00").code(), absl::StatusCode::kAborted);
  // Registering again (a restarted process) retires the old session.
  auto again = server->Register("a", Signature());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->rank, a->rank);
  EXPECT_EQ(server->CheckSession(a->rank, a->session).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(server->CheckSession(a->rank, again->session).ok());
  // Another server process has another incarnation.
  EXPECT_NE(MakeServer(2)->incarnation(), server->incarnation());
}

// Gradients of two workers for iteration `it`, chunk by chunk: worker r's
// value for element i is a function of (it, r, i), as a real worker's is of
// (version, step), so a restarted worker recomputes the same bits.
float GradientOf(int64_t it, int rank, int64_t i) {
  return 0.1f * static_cast<float>(it + 1) + 0.01f * static_cast<float>(rank) -
         0.003f * static_cast<float>(i);
}
void PushChunkOf(ParameterServer& server, int rank, int64_t it, int key, int64_t chunk,
                 absl::StatusCode expected = absl::StatusCode::kOk) {
  const int64_t n = server.ChunkLength(key, chunk);
  std::vector<float> g(n);
  for (int64_t i = 0; i < n; ++i) g[i] = GradientOf(it, rank, key * 100 + chunk * 10 + i);
  EXPECT_EQ(Push(server, rank, it, key, chunk, 3 + rank, g).code(), expected)
      << "rank " << rank << " key " << key << " chunk " << chunk;
}

// A worker that registers again mid-iteration (its process restarted after
// pushing part of the iteration) pulls that iteration's version exactly,
// even the chunks already updated, pushes everything again, and the server
// counts its earlier chunks once: the parameters are bit for bit those of a
// run without the restart.
TEST_F(ParameterServerTest, AWorkerRejoiningMidIterationChangesNoBit) {
  auto reference = MakeServer(2);
  auto server = MakeServer(2);
  for (auto* s : {reference.get(), server.get()}) {
    ASSERT_TRUE(s->Register("w0", Signature(), 0).ok());
    ASSERT_TRUE(s->Register("w1", Signature(), 1).ok());
  }
  const std::vector<std::pair<int, int64_t>> chunks = {{1, 0}, {0, 1}, {0, 0}};  // backward order
  for (int64_t it = 0; it < 3; ++it) {
    for (const auto& [key, chunk] : chunks) {
      for (int rank = 0; rank < 2; ++rank) PushChunkOf(*reference, rank, it, key, chunk);
    }
  }
  // Iteration 0 whole; in iteration 1 worker 1 pushes two chunks (one of
  // which worker 0 pushes too, so it is applied) and dies.
  for (const auto& [key, chunk] : chunks) {
    for (int rank = 0; rank < 2; ++rank) PushChunkOf(*server, rank, 0, key, chunk);
  }
  std::vector<float> version1 = Params(*server);
  PushChunkOf(*server, 1, 1, 1, 0);
  PushChunkOf(*server, 1, 1, 0, 1);
  PushChunkOf(*server, 0, 1, 1, 0);  // chunk (1, 0) of iteration 1 applied
  auto rejoined = server->Register("w1", Signature());
  ASSERT_TRUE(rejoined.ok());
  EXPECT_EQ(rejoined->rank, 1);
  EXPECT_EQ(rejoined->version, 1);
  // Exactly version 1, though chunk (1, 0) is at version 2 already.
  const ParameterServer::ChunkId all[] = {{0, 0}, {0, 1}, {1, 0}};
  auto views = server->PullChunkViews(1, absl::InfinitePast(), all, /*exact=*/true);
  ASSERT_TRUE(views.ok()) << views.status();
  EXPECT_EQ(views->version, 1);
  EXPECT_EQ(Values(views->chunks[2]), std::vector<float>(version1.begin() + 6, version1.end()));
  auto loose = server->PullChunkViews(1, absl::InfinitePast(), all);
  ASSERT_TRUE(loose.ok());
  EXPECT_EQ(loose->version, 1);
  EXPECT_NE(Values(loose->chunks[2]), Values(views->chunks[2]));  // the newer bias
  // The rejoined worker pushes the whole iteration again.
  for (const auto& [key, chunk] : chunks) PushChunkOf(*server, 1, 1, key, chunk);
  PushChunkOf(*server, 1, 1, 0, 0, absl::StatusCode::kAlreadyExists);  // once is all
  PushChunkOf(*server, 0, 1, 0, 1);
  PushChunkOf(*server, 0, 1, 0, 0);
  EXPECT_EQ(server->version(), 2);
  for (const auto& [key, chunk] : chunks) {
    for (int rank = 0; rank < 2; ++rank) PushChunkOf(*server, rank, 2, key, chunk);
  }
  EXPECT_EQ(Params(*server), Params(*reference));
  // Two updates ahead, a version is gone.
  EXPECT_EQ(server->PullChunkViews(1, absl::InfinitePast(), all, true).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// The state is captured at a version boundary: at once between iterations,
// else by the push that ends the iteration in progress; a server created
// from it continues bit for bit (momentum, learning-rate schedule).
TEST_F(ParameterServerTest, CapturedStateResumesBitForBit) {
  ParameterServerOptions options;
  options.num_workers = 2;
  options.chunk_elements = 4;
  options.optimizer.sgd.lr = 0.5f;
  options.optimizer.sgd.momentum = 0.9f;
  options.optimizer.sgd.weight_decay = 0.01f;
  options.optimizer.schedule.unit = LrSchedule::Unit::kEpochs;
  options.optimizer.schedule.step_size = 1;
  options.optimizer.schedule.gamma = 0.5f;
  auto make = [&] {
    auto s = ParameterServer::Create(options, Signature(), Initial(), &device_);
    EXPECT_TRUE(s.ok()) << s.status();
    return std::move(s).value();
  };
  const std::vector<std::pair<int, int64_t>> chunks = {{1, 0}, {0, 1}, {0, 0}};
  auto run = [&](ParameterServer& s, int64_t from, int64_t to) {
    for (int64_t it = from; it < to; ++it) {
      for (const auto& [key, chunk] : chunks) {
        for (int rank = 0; rank < 2; ++rank) PushChunkOf(s, rank, it, key, chunk);
      }
    }
  };
  auto reference = make();
  auto server = make();
  for (auto* s : {reference.get(), server.get()}) {
    ASSERT_TRUE(s->Register("w0", Signature(), 0, /*steps_per_epoch=*/2).ok());
    ASSERT_TRUE(s->Register("w1", Signature(), 1, 2).ok());
  }
  run(*reference, 0, 6);
  run(*server, 0, 3);
  // Mid-iteration 3 with a chunk applied: served when version 4 exists.
  PushChunkOf(*server, 0, 3, 1, 0);
  PushChunkOf(*server, 1, 3, 1, 0);
  std::vector<ParameterServer::State> captured;
  server->CaptureState([&](ParameterServer::State s) { captured.push_back(std::move(s)); });
  EXPECT_TRUE(captured.empty());
  for (const auto& [key, chunk] : {std::pair<int, int64_t>{0, 1}, {0, 0}}) {
    for (int rank = 0; rank < 2; ++rank) PushChunkOf(*server, rank, 3, key, chunk);
  }
  ASSERT_EQ(captured.size(), 1u);
  EXPECT_EQ(captured[0].version, 4);
  EXPECT_EQ(captured[0].steps_per_epoch, 2);
  EXPECT_EQ(captured[0].parameters, Params(*server));
  EXPECT_EQ(captured[0].momentum.size(), 8u);
  // Between iterations: at once.
  server->CaptureState([&](ParameterServer::State s) { captured.push_back(std::move(s)); });
  ASSERT_EQ(captured.size(), 2u);
  EXPECT_EQ(captured[1].version, 4);
  EXPECT_EQ(server->CancelCaptures(), 0);

  auto resumed = ParameterServer::CreateFromState(options, captured[0], &device_);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ((*resumed)->version(), 4);
  EXPECT_TRUE((*resumed)->initialized());
  // Workers state the same model and steps per epoch...
  EXPECT_EQ((*resumed)->Register("w0", Signature(), 0, 3).status().code(),
            absl::StatusCode::kFailedPrecondition);
  auto w0 = (*resumed)->Register("w0", Signature(), 0, 2);
  ASSERT_TRUE(w0.ok());
  EXPECT_EQ(w0->version, 4);
  EXPECT_FALSE(w0->send_initial_parameters);
  ASSERT_TRUE((*resumed)->Register("w1", Signature(), 1, 2).ok());
  // ... and the updates go on as if nothing had happened.
  run(**resumed, 4, 6);
  EXPECT_EQ(Params(**resumed), Params(*reference));

  // A state that does not fit the options is refused.
  ParameterServer::State no_momentum = captured[0];
  no_momentum.momentum.clear();
  EXPECT_EQ(ParameterServer::CreateFromState(options, no_momentum, &device_).status().code(),
            absl::StatusCode::kInvalidArgument);
  ParameterServer::State short_params = captured[0];
  short_params.parameters.pop_back();
  EXPECT_EQ(ParameterServer::CreateFromState(options, short_params, &device_).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A state of no parameters at all, for a server without momentum.
  ParameterServer::State nothing = captured[0];
  nothing.signature.clear();
  nothing.parameters.clear();
  nothing.momentum.clear();
  ParameterServerOptions plain = options;
  plain.optimizer.sgd.momentum = 0;
  EXPECT_EQ(ParameterServer::CreateFromState(plain, nothing, &device_).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Pending captures can be dropped (a server stopping mid-iteration).
  PushChunkOf(*server, 0, 4, 1, 0);
  PushChunkOf(*server, 1, 4, 1, 0);
  server->CaptureState([&](ParameterServer::State) { ADD_FAILURE() << "not at a boundary"; });
  EXPECT_EQ(server->CancelCaptures(), 1);
}

// Shrinking: a dropped rank's missing parts are waived (each chunk updated
// with what arrived, over the samples it covers), the next announced
// iteration still lists it (its part missing), the one after does not, its
// pushes are refused, and it rejoins at the first unannounced iteration.
TEST_F(ParameterServerTest, ADroppedWorkerIsWaivedAndRejoinsAtABoundary) {
  auto server = MakeServer(3);  // lr 1, chunks of 4: keys 0 (chunks 0, 1) and 1
  auto a = server->Register("a", Signature(), 0);
  auto b = server->Register("b", Signature(), 1);
  auto c = server->Register("c", Signature(), 2);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->members, (std::vector<int>{0, 1, 2}));
  auto push = [&](int rank, int64_t it, int key, int64_t chunk, float g,
                  absl::StatusCode code = absl::StatusCode::kOk) {
    const int64_t n = server->ChunkLength(key, chunk);
    EXPECT_EQ(Push(*server, rank, it, key, chunk, /*samples=*/1, std::vector<float>(n, g)).code(),
              code)
        << "rank " << rank << " iteration " << it << " key " << key << " chunk " << chunk;
  };
  // Iteration 0: ranks 0 and 2 push everything (gradient 3 and 6), rank 1
  // only key 1 (gradient 9) before it is lost.
  push(1, 0, 1, 0, 9.f);
  for (int rank : {2, 0}) {
    push(rank, 0, 0, 0, rank == 0 ? 3.f : 6.f);
    push(rank, 0, 0, 1, rank == 0 ? 3.f : 6.f);
    push(rank, 0, 1, 0, rank == 0 ? 3.f : 6.f);
  }
  EXPECT_EQ(server->version(), 0);  // key 1 applied; key 0 waits for rank 1
  auto dropped = server->DropWorker(1);
  ASSERT_TRUE(dropped.ok()) << dropped.status();
  EXPECT_EQ(dropped->size(), 2u);  // key 0's two chunks
  EXPECT_EQ(server->version(), 1);
  // Key 0: (3 + 6) / 2 samples = 4.5; key 1: (3 + 9 + 6) / 3 = 6.
  EXPECT_EQ(Params(*server), (std::vector<float>{1 - 4.5f, 2 - 4.5f, 3 - 4.5f, 4 - 4.5f,
                                                 5 - 4.5f, 6 - 4.5f, 0.5f - 6, -0.5f - 6}));
  // Iteration 1 was announced with rank 1 (at the first push of 0): the
  // workers split its batch three ways; rank 1's part is missing.
  EXPECT_EQ(server->Members(1).value(), (std::vector<int>{0, 1, 2}));
  push(1, 1, 0, 0, 1.f, absl::StatusCode::kAborted);
  // Key 1 completes without rank 1 and is applied: a state captured now
  // would hold key 1 after iteration 1 and key 0 before it, so the capture
  // waits for the boundary.
  for (int rank : {0, 2}) push(rank, 1, 1, 0, 1.f);
  std::vector<ParameterServer::State> captured;
  server->CaptureState([&](ParameterServer::State state) { captured.push_back(std::move(state)); });
  EXPECT_TRUE(captured.empty()) << "captured mid-iteration, with key 1 updated and key 0 not";
  for (int rank : {0, 2}) {
    push(rank, 1, 0, 0, 1.f);
    push(rank, 1, 0, 1, 1.f);
  }
  EXPECT_EQ(server->version(), 2);
  ASSERT_EQ(captured.size(), 1u);
  EXPECT_EQ(captured[0].version, 2);
  EXPECT_EQ(captured[0].parameters, Params(*server));
  EXPECT_EQ(server->Members(2).value(), (std::vector<int>{0, 2}));  // announced at iteration 1's first push
  EXPECT_EQ(server->Members(3).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(server->Members(0).status().code(), absl::StatusCode::kOutOfRange);
  // Rank 1 comes back before any push of iteration 2: it joins at 3.
  auto back = server->Register("b", Signature(), 1);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->version, 3);
  EXPECT_EQ(back->members, (std::vector<int>{0, 1, 2}));
  for (int rank : {0, 2}) {
    push(rank, 2, 0, 0, 1.f);
    push(rank, 2, 0, 1, 1.f);
    push(rank, 2, 1, 0, 1.f);
  }
  EXPECT_EQ(server->version(), 3);
  // Iteration 3 needs all three again.
  for (int rank : {0, 2}) {
    push(rank, 3, 0, 0, 1.f);
    push(rank, 3, 0, 1, 1.f);
    push(rank, 3, 1, 0, 1.f);
  }
  EXPECT_EQ(server->version(), 3);
  push(1, 3, 0, 0, 1.f);
  push(1, 3, 0, 1, 1.f);
  push(1, 3, 1, 0, 1.f);
  EXPECT_EQ(server->version(), 4);
  // Once iteration 4's members are announced without a dropped rank, it
  // must wait; and the last member cannot be dropped.
  ASSERT_TRUE(server->DropWorker(0).ok());
  ASSERT_TRUE(server->DropWorker(1).ok());
  EXPECT_EQ(server->DropWorker(2).status().code(), absl::StatusCode::kFailedPrecondition);
}

// A held part that becomes the sum's first term once the ranks before it
// are waived starts the sum as 0 + g, like any first term (-0 becomes +0):
// the sum does not depend on whether the part came before or after the drop.
TEST_F(ParameterServerTest, AHeldPartThatBecomesTheFirstTermStartsTheSumAsZeroPlusIt) {
  ParameterServerOptions options;
  options.num_workers = 2;
  options.chunk_elements = 4;
  options.optimizer.sgd.lr = 1.f;
  std::vector<float> initial = Initial();
  initial[0] = -0.f;
  auto server = ParameterServer::Create(options, Signature(), initial, &device_);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE((*server)->Register("a", Signature(), 0).ok());
  ASSERT_TRUE((*server)->Register("b", Signature(), 1).ok());
  // Rank 1's part of chunk (0, 0) comes first and is held for rank 0's.
  ASSERT_TRUE(Push(**server, 1, 0, 0, 0, /*samples=*/1, std::vector<float>(4, -0.f)).ok());
  ASSERT_TRUE((*server)->DropWorker(0).ok());
  // -0 - (0 + -0) = -0 - +0 = -0; a sum started as -0 would give +0.
  const std::vector<float> params = Params(**server);
  EXPECT_EQ(params[0], 0.f);
  EXPECT_TRUE(std::signbit(params[0]));
}

// Asynchronous consistency: each push is an update of its chunks at once,
// scaled by its own samples; chunk versions count updates, the server's is
// their least, and the staleness says how many updates a push's chunks got
// since the version it was computed from.
TEST_F(ParameterServerTest, AsyncAppliesEachPushAsItArrives) {
  ParameterServerOptions options;
  options.num_workers = 2;
  options.chunk_elements = 4;
  options.optimizer.sgd.lr = 1.f;
  options.consistency = AsyncConsistency();
  auto server = ParameterServer::Create(options, Signature(), Initial(), &device_);
  ASSERT_TRUE(server.ok());
  ASSERT_TRUE((*server)->Register("a", Signature(), 0).ok());
  ASSERT_TRUE((*server)->Register("b", Signature(), 1).ok());
  auto push = [&](int rank, int64_t based_on, int key, int64_t chunk, float g, int64_t samples) {
    const int64_t n = std::max<int64_t>(1, (*server)->ChunkLength(key, chunk));
    const std::vector<float> values(n, g);
    const absl::string_view piece(reinterpret_cast<const char*>(values.data()), n * 4);
    const ParameterServer::ChunkBytes bytes{key, chunk, absl::MakeConstSpan(&piece, 1)};
    return (*server)->ApplyNow(rank, based_on, samples, absl::MakeConstSpan(&bytes, 1));
  };
  // Worker 0 alone moves the bias at once: lr 1, gradient sum 2 over 2
  // samples.
  auto stale = push(0, 0, 1, 0, 2.f, 2);
  ASSERT_TRUE(stale.ok()) << stale.status();
  EXPECT_EQ(*stale, 0);
  EXPECT_EQ(Params(**server)[6], -0.5f);
  EXPECT_EQ((*server)->version(), 0);  // the weight's chunks have not moved
  // Worker 1, computed from version 0, is one update behind on the bias.
  stale = push(1, 0, 1, 0, 1.f, 1);
  ASSERT_TRUE(stale.ok());
  EXPECT_EQ(*stale, 1);
  EXPECT_EQ(Params(**server)[6], -1.5f);
  // The same chunk again from the same worker is another update, not a
  // repeat; a synchronous push is refused, and so is a bad chunk.
  EXPECT_TRUE(push(0, 2, 1, 0, 0.f, 1).ok());
  EXPECT_EQ(Push(**server, 0, 0, 0, 0, 1, std::vector<float>(4, 1.f)).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(push(0, 0, 7, 0, 1.f, 1).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(push(5, 0, 1, 0, 1.f, 1).status().code(), absl::StatusCode::kNotFound);
  // Nobody waits for a lost worker here: nothing to shrink.
  EXPECT_EQ((*server)->DropWorker(1).status().code(), absl::StatusCode::kFailedPrecondition);
  // A version from the wire below 0 (the staleness would overflow) is
  // refused, and nothing moves.
  const auto from_nowhere = push(0, std::numeric_limits<int64_t>::min(), 1, 0, 1.f, 1);
  EXPECT_EQ(from_nowhere.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(from_nowhere.status().message()), HasSubstr("versions start at 0"));
  EXPECT_EQ(Params(**server)[6], -1.5f);
  // Once every chunk has moved, so has the server's version.
  ASSERT_TRUE(push(0, 0, 0, 0, 1.f, 1).ok());
  ASSERT_TRUE(push(0, 0, 0, 1, 1.f, 1).ok());
  EXPECT_EQ((*server)->version(), 1);
  // A pull of version 0 returns the newest at once.
  std::vector<float> out(8);
  EXPECT_TRUE(Pull(**server, 0, absl::InfinitePast(), absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, (std::vector<float>{0, 1, 2, 3, 4, 5, -1.5f, -2.5f}));
}

// Whether two float vectors are equal bit for bit; names the first element
// that differs.
::testing::AssertionResult BitIdentical(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) {
    return ::testing::AssertionFailure() << a.size() << " vs " << b.size() << " elements";
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      return ::testing::AssertionFailure() << "element " << i << ": " << a[i] << " vs " << b[i];
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(ConsistencyTest, CreateRefusesNoPolicy) {
  ParameterServerOptions options;
  options.consistency = nullptr;
  CpuDevice device(0, 1);
  const absl::Status status = ParameterServer::Create(options, &device).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("no consistency policy"));
}

// A server of two workers under ssp:S with MakeServer's model (chunks of
// 4: key 0 in chunks 0 and 1, key 1 in one), both registered.
std::unique_ptr<ParameterServer> MakeSspServer(int64_t staleness, CpuDevice* device,
                                               float momentum = 0.f) {
  ParameterServerOptions options;
  options.num_workers = 2;
  options.chunk_elements = 4;
  options.optimizer.sgd.lr = 0.5f;
  options.optimizer.sgd.momentum = momentum;
  options.optimizer.sgd.weight_decay = 0.01f;
  options.optimizer.schedule.unit = LrSchedule::Unit::kSteps;
  options.optimizer.schedule.step_size = 2;
  options.optimizer.schedule.gamma = 0.5f;
  if (staleness >= 0) {
    options.consistency = SspConsistency(staleness).value();
  }
  auto server = ParameterServer::Create(options, Signature(), Initial(), device);
  EXPECT_TRUE(server.ok()) << server.status();
  EXPECT_TRUE((*server)->Register("w0", Signature(), 0).ok());
  EXPECT_TRUE((*server)->Register("w1", Signature(), 1).ok());
  return std::move(server).value();
}

const std::vector<std::pair<int, int64_t>>& AllChunks() {
  static const auto* chunks = new std::vector<std::pair<int, int64_t>>{{0, 0}, {0, 1}, {1, 0}};
  return *chunks;
}

void PushIteration(ParameterServer& server, int rank, int64_t it) {
  for (const auto& [key, chunk] : AllChunks()) PushChunkOf(server, rank, it, key, chunk);
}

// The bound: a rank may push iteration t once version t - S exists, so the
// fast rank runs S iterations ahead of the slowest and no further; what it
// pulls to begin step t (version t - S) waits for the slow rank's push of
// t - S - 1; a push past the bound is refused with kOutOfRange naming the
// bound and the ranks waited for, and changes nothing.
TEST_F(ParameterServerTest, SspHoldsTheFastRankAtTheBound) {
  auto server = MakeSspServer(/*staleness=*/1, &device_);
  PushIteration(*server, 0, 0);
  PushIteration(*server, 0, 1);  // one ahead: within ssp:1
  EXPECT_EQ(server->version(), 0);
  const std::vector<float> before = Params(*server);
  std::vector<float> g(4, 1.f);
  const absl::Status ahead = Push(*server, 0, 2, 0, 0, 3, g);
  EXPECT_EQ(ahead.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(ahead.message(), HasSubstr("ssp:1"));
  EXPECT_THAT(ahead.message(), HasSubstr("waiting for ranks 1"));
  EXPECT_EQ(Params(*server), before);
  EXPECT_EQ(server->held_elements(), 0);
  // Where each rank is: rank 0 at step 2 (waiting), rank 1 at 0.
  const ParameterServer::Progress progress = server->progress();
  EXPECT_EQ(progress.workers[0].next_iteration, 2);
  EXPECT_EQ(progress.workers[0].last_push_iteration, 1);
  EXPECT_EQ(progress.workers[1].next_iteration, 0);
  // Rank 0's step 2 needs version 1: its pull waits for rank 1's push of 0.
  EXPECT_FALSE(server->HasChunks(1, {{0, 0}}));
  std::vector<float> out(4);
  EXPECT_EQ(PullChunks(*server, 1, absl::Now() + absl::Milliseconds(20), {{0, 0, absl::MakeSpan(out)}})
                .status()
                .code(),
            absl::StatusCode::kDeadlineExceeded);
  absl::Notification pulled;
  std::thread waiter([&] {
    auto v = PullChunks(*server, 1, absl::Now() + absl::Seconds(20), {{0, 0, absl::MakeSpan(out)}});
    EXPECT_TRUE(v.ok()) << v.status();
    if (v.ok()) {
      EXPECT_EQ(*v, 1);  // iteration 1 waits for rank 1 too
    }
    pulled.Notify();
  });
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_FALSE(pulled.HasBeenNotified());
  PushIteration(*server, 1, 0);
  waiter.join();
  EXPECT_EQ(server->version(), 1);
  // Now step 2 may be pushed; past iterations and repeats are refused.
  PushIteration(*server, 0, 2);
  PushChunkOf(*server, 1, 0, 0, 0, absl::StatusCode::kFailedPrecondition);
  PushChunkOf(*server, 0, 2, 1, 0, absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(Push(*server, 0, 3, 0, 0, 3, g).code(), absl::StatusCode::kOutOfRange);
  PushIteration(*server, 1, 1);
  EXPECT_EQ(server->version(), 2);
  PushIteration(*server, 1, 2);
  EXPECT_EQ(server->version(), 3);
  // No shrinking with iterations in flight.
  EXPECT_EQ(server->DropWorker(1).status().code(), absl::StatusCode::kFailedPrecondition);
}

// The updates are sync's: whatever order the pushes of the iterations in
// flight arrive in (a rank ahead, iterations of one rank out of order,
// chunks reversed), iteration k's update is the rank-order sum of the
// step-k pushes at step k's learning rate, so ssp:S ends bit for bit where
// sync does, with momentum, weight decay and a step schedule.
TEST_F(ParameterServerTest, SspAppliesTheIterationsInOrderBitForBitAsSync) {
  auto sync = MakeSspServer(/*staleness=*/-1, &device_, /*momentum=*/0.9f);
  for (int64_t it = 0; it < 9; ++it) {
    PushIteration(*sync, 0, it);
    PushIteration(*sync, 1, it);
  }
  EXPECT_EQ(sync->version(), 9);
  const std::vector<float> reference = Params(*sync);
  for (const int64_t staleness : {0, 2}) {
    auto ssp = MakeSspServer(staleness, &device_, 0.9f);
    const int64_t window = staleness + 1;
    for (int64_t first = 0; first < 9; first += window) {
      // The window [first, first + S]: rank 1 pushes its iterations last
      // first, chunks reversed, then rank 0; nothing is applied until
      // rank 0's iteration `first`, and then everything.
      for (const int rank : {1, 0}) {
        for (int64_t it = std::min<int64_t>(9, first + window) - 1; it >= first; --it) {
          for (auto c = AllChunks().rbegin(); c != AllChunks().rend(); ++c) {
            PushChunkOf(*ssp, rank, it, c->first, c->second);
          }
        }
        EXPECT_EQ(ssp->version(), rank == 1 ? first : std::min<int64_t>(9, first + window));
      }
    }
    EXPECT_EQ(ssp->held_elements(), 0);
    EXPECT_TRUE(BitIdentical(Params(*ssp), reference)) << "ssp:" << staleness;
  }
}

// A capture under ssp:S waits for a boundary with no chunk ahead: the
// updates past it wait (their pushes are summed), the state is exactly
// sync's at that version (parameters and momentum), the held updates follow,
// and a server resumed from it goes on bit for bit. Cancelled captures
// release what they held.
// A capture filed ahead for version 3 is taken at 3 exactly, whatever the
// pushes of iteration 3 that arrive meanwhile (held, then applied); one
// for a version already passed is taken at the next boundary.
TEST_F(ParameterServerTest, ACaptureAtAVersionIsTakenThereExactly) {
  ParameterServerOptions options;
  options.num_workers = 2;
  options.chunk_elements = 4;
  options.optimizer.sgd.lr = 0.5f;
  auto made = ParameterServer::Create(options, Signature(), Initial(), &device_);
  ASSERT_TRUE(made.ok()) << made.status();
  ParameterServer& server = **made;
  ASSERT_TRUE(server.Register("w0", Signature(), 0).ok());
  ASSERT_TRUE(server.Register("w1", Signature(), 1).ok());
  const std::vector<std::pair<int, int64_t>> chunks = {{1, 0}, {0, 1}, {0, 0}};
  auto push = [&](int64_t it, int rank) {
    for (const auto& [key, chunk] : chunks) PushChunkOf(server, rank, it, key, chunk);
  };
  std::vector<ParameterServer::State> captured;
  server.CaptureState([&](ParameterServer::State s) { captured.push_back(std::move(s)); }, 3);
  for (int64_t it = 0; it < 3; ++it) {
    push(it, 0);
    push(it, 1);
  }
  ASSERT_EQ(captured.size(), 1u);
  EXPECT_EQ(captured[0].version, 3);
  push(3, 0);
  push(3, 1);
  EXPECT_EQ(server.version(), 4);
  // Mid-iteration 4 with a chunk applied: 4 is passed, 5 it is.
  for (int rank = 0; rank < 2; ++rank) PushChunkOf(server, rank, 4, 1, 0);
  server.CaptureState([&](ParameterServer::State s) { captured.push_back(std::move(s)); }, 4);
  EXPECT_EQ(captured.size(), 1u);
  for (const auto& [key, chunk] : {std::pair<int, int64_t>{0, 1}, {0, 0}}) {
    for (int rank = 0; rank < 2; ++rank) PushChunkOf(server, rank, 4, key, chunk);
  }
  ASSERT_EQ(captured.size(), 2u);
  EXPECT_EQ(captured[1].version, 5);
}

TEST_F(ParameterServerTest, SspCaptureHoldsTheUpdatesAheadOfItsBoundary) {
  auto sync = MakeSspServer(-1, &device_, /*momentum=*/0.9f);
  std::vector<ParameterServer::State> reference;
  for (int64_t it = 0; it < 5; ++it) {
    PushIteration(*sync, 0, it);
    PushIteration(*sync, 1, it);
    if (it == 1) sync->CaptureState([&](ParameterServer::State s) { reference.push_back(s); });
  }
  ASSERT_EQ(reference.size(), 1u);
  ASSERT_EQ(reference[0].version, 2);

  auto server = MakeSspServer(/*staleness=*/1, &device_, 0.9f);
  // The bias (key 1) runs two updates ahead of the server's version 0.
  for (const int64_t it : {0, 1}) {
    for (int rank = 0; rank < 2; ++rank) PushChunkOf(*server, rank, it, 1, 0);
  }
  EXPECT_TRUE(server->HasChunks(2, {{1, 0}}));
  std::vector<ParameterServer::State> captured;
  server->CaptureState([&](ParameterServer::State s) { captured.push_back(std::move(s)); });
  EXPECT_TRUE(captured.empty());
  // Iteration 0 completes (version 1): no boundary yet, the bias is at 2.
  for (const auto& [key, chunk] : {std::pair<int, int64_t>{0, 0}, {0, 1}}) {
    for (int rank = 0; rank < 2; ++rank) PushChunkOf(*server, rank, 0, key, chunk);
  }
  EXPECT_EQ(server->version(), 1);
  EXPECT_TRUE(captured.empty());
  // Iteration 2's bias, complete, waits for the capture.
  for (int rank = 0; rank < 2; ++rank) PushChunkOf(*server, rank, 2, 1, 0);
  EXPECT_FALSE(server->HasChunks(3, {{1, 0}}));
  // Iteration 1 completes: version 2 is the boundary, captured, then the
  // bias's update of iteration 2 is applied.
  for (const auto& [key, chunk] : {std::pair<int, int64_t>{0, 0}, {0, 1}}) {
    for (int rank = 0; rank < 2; ++rank) PushChunkOf(*server, rank, 1, key, chunk);
  }
  ASSERT_EQ(captured.size(), 1u);
  EXPECT_EQ(captured[0].version, 2);
  EXPECT_TRUE(BitIdentical(captured[0].parameters, reference[0].parameters));
  EXPECT_TRUE(BitIdentical(captured[0].momentum, reference[0].momentum));
  EXPECT_TRUE(server->HasChunks(3, {{1, 0}}));
  EXPECT_EQ(server->version(), 2);

  // A capture dropped before its boundary lets the updates it held go.
  for (int rank = 0; rank < 2; ++rank) PushChunkOf(*server, rank, 2, 0, 0);  // version 2 in progress
  server->CaptureState([&](ParameterServer::State) { ADD_FAILURE() << "cancelled"; });
  for (int rank = 0; rank < 2; ++rank) PushChunkOf(*server, rank, 3, 1, 0);
  EXPECT_FALSE(server->HasChunks(4, {{1, 0}}));  // held: the capture waits for version 3
  EXPECT_EQ(server->CancelCaptures(), 1);
  EXPECT_TRUE(server->HasChunks(4, {{1, 0}}));
  for (int rank = 0; rank < 2; ++rank) PushChunkOf(*server, rank, 2, 0, 1);
  EXPECT_EQ(server->version(), 3);
  for (int rank = 0; rank < 2; ++rank) {
    PushChunkOf(*server, rank, 3, 0, 0);
    PushChunkOf(*server, rank, 3, 0, 1);
  }
  for (int rank = 0; rank < 2; ++rank) PushIteration(*server, rank, 4);
  EXPECT_EQ(server->version(), 5);
  EXPECT_TRUE(BitIdentical(Params(*server), Params(*sync)));

  // Resumed from the captured state, under ssp:1 again: the same bits.
  ParameterServerOptions options = server->options();
  auto resumed = ParameterServer::CreateFromState(options, captured[0], &device_);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  ASSERT_TRUE((*resumed)->Register("w0", Signature(), 0).ok());
  ASSERT_TRUE((*resumed)->Register("w1", Signature(), 1).ok());
  for (const int64_t it : {3, 2}) PushIteration(**resumed, 1, it);
  for (const int64_t it : {2, 3}) PushIteration(**resumed, 0, it);
  for (int rank = 0; rank < 2; ++rank) PushIteration(**resumed, rank, 4);
  EXPECT_EQ((*resumed)->version(), 5);
  EXPECT_TRUE(BitIdentical(Params(**resumed), Params(*sync)));
}

// A worker that rejoins under ssp:S resumes at the server's version; what
// its previous process pushed of every iteration in flight is counted
// once.
TEST_F(ParameterServerTest, SspRejoiningWorkerIsCountedOnceInEveryIterationInFlight) {
  auto sync = MakeSspServer(-1, &device_);
  for (int64_t it = 0; it < 3; ++it) {
    PushIteration(*sync, 0, it);
    PushIteration(*sync, 1, it);
  }
  auto server = MakeSspServer(/*staleness=*/2, &device_);
  // Rank 1 pushes all of iteration 0, part of 1 and of 2, and restarts.
  PushIteration(*server, 1, 0);
  PushChunkOf(*server, 1, 1, 1, 0);
  PushChunkOf(*server, 1, 2, 0, 1);
  PushChunkOf(*server, 0, 1, 1, 0);
  auto rejoined = server->Register("w1", Signature());
  ASSERT_TRUE(rejoined.ok()) << rejoined.status();
  EXPECT_EQ(rejoined->rank, 1);
  EXPECT_EQ(rejoined->version, 0);
  // It pushes everything again: the earlier parts are dropped.
  for (int64_t it = 0; it < 3; ++it) PushIteration(*server, 1, it);
  for (int64_t it = 0; it < 3; ++it) {
    for (const auto& [key, chunk] : AllChunks()) {
      if (it == 1 && key == 1) continue;  // pushed before
      PushChunkOf(*server, 0, it, key, chunk);
    }
  }
  EXPECT_EQ(server->version(), 3);
  EXPECT_EQ(server->held_elements(), 0);
  EXPECT_TRUE(BitIdentical(Params(*server), Params(*sync)));
}

// Learning-rate warm-up follows the step, so a server resumed from a state
// captured inside the warm-up goes on with the warm-up's next fraction:
// lr 0.8 over 4 warm-up steps, gradient 1 over 1 sample, is 0.2, 0.4, 0.6,
// 0.8, then the step decay (x0.5 every 5 steps).
TEST_F(ParameterServerTest, WarmUpContinuesAcrossARestoreStepByStep) {
  const std::vector<ParamSpec> signature = {{"w", {1}, DType::kF32}};
  ParameterServerOptions options;
  options.num_workers = 1;
  options.optimizer.sgd.lr = 0.8f;
  options.optimizer.schedule.warmup_steps = 4;
  options.optimizer.schedule.unit = LrSchedule::Unit::kSteps;
  options.optimizer.schedule.step_size = 5;
  options.optimizer.schedule.gamma = 0.5f;
  const float expected_lr[] = {0.2f, 0.4f, 0.6f, 0.8f, 0.8f, 0.4f, 0.4f};
  auto created = ParameterServer::Create(options, signature, {0.f}, &device_);
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<ParameterServer> server = std::move(created).value();
  ASSERT_TRUE(server->Register("w", signature).ok());
  float want = 0.f;
  for (int64_t step = 0; step < 7; ++step) {
    if (step == 2) {
      // A restart from the state captured at version 2.
      std::vector<ParameterServer::State> captured;
      server->CaptureState([&](ParameterServer::State s) { captured.push_back(std::move(s)); });
      ASSERT_EQ(captured.size(), 1u);
      EXPECT_EQ(captured[0].version, 2);
      auto resumed = ParameterServer::CreateFromState(options, captured[0], &device_);
      ASSERT_TRUE(resumed.ok()) << resumed.status();
      server = std::move(resumed).value();
      ASSERT_TRUE(server->Register("w", signature).ok());
    }
    ASSERT_TRUE(Push(*server, 0, step, 0, 0, 1, std::vector<float>{1.f}).ok());
    want -= expected_lr[step];
    std::vector<float> out(1);
    ASSERT_TRUE(Pull(*server, step + 1, absl::InfiniteFuture(), absl::MakeSpan(out)).ok());
    EXPECT_FLOAT_EQ(out[0], want) << "step " << step;
  }
}

// Per-chunk updates give the bits of one SGD Optimizer::Apply of the whole
// model to the rank-order sum, over iterations with momentum and weight
// decay, whatever order the chunks arrive in (reverse rank order included),
// with an empty tensor in the model.
TEST_F(ParameterServerTest, PerChunkUpdatesEqualOneWholeModelUpdateBitForBit) {
  const std::vector<ParamSpec> signature = {{"fc.weight", {3, 3}, DType::kF32},
                                            {"empty", {0}, DType::kF32},
                                            {"fc.bias", {3}, DType::kF32}};
  constexpr int kWorkers = 3;
  constexpr int64_t kN = 12;
  ParameterServerOptions options;
  options.num_workers = kWorkers;
  options.chunk_elements = 4;  // fc.weight: 4 + 4 + 1, empty: 0, fc.bias: 3
  options.optimizer.sgd.lr = 0.1f;
  options.optimizer.sgd.momentum = 0.9f;
  options.optimizer.sgd.weight_decay = 0.01f;
  options.optimizer.schedule.unit = LrSchedule::Unit::kSteps;
  options.optimizer.schedule.step_size = 2;
  options.optimizer.schedule.gamma = 0.5f;
  std::vector<float> initial(kN);
  for (int64_t i = 0; i < kN; ++i) initial[i] = std::sin(0.9f * i);
  auto created = ParameterServer::Create(options, signature, initial, &device_);
  ASSERT_TRUE(created.ok()) << created.status();
  ParameterServer& server = **created;
  for (int r = 0; r < kWorkers; ++r) {
    ASSERT_TRUE(server.Register(absl::StrCat("w", r), signature, r).ok());
  }
  auto reference = CreateOptimizer(options.optimizer, kN, &device_);
  ASSERT_TRUE(reference.ok()) << reference.status();
  std::vector<float> expected = initial;

  struct Chunk {
    int key;
    int64_t chunk, offset, length;
  };
  const std::vector<Chunk> chunks = {{0, 0, 0, 4}, {0, 1, 4, 4}, {0, 2, 8, 1},
                                     {1, 0, 9, 0}, {2, 0, 9, 3}};
  struct Arrival {
    int rank;
    size_t chunk;
  };
  for (int64_t it = 0; it < 6; ++it) {
    // Gradients whose float sum depends on its order, and samples that
    // differ per worker (none at all in iteration 4: no update there).
    std::vector<std::vector<float>> grads(kWorkers, std::vector<float>(kN));
    const int64_t samples[kWorkers] = {it == 4 ? 0 : 2, it == 4 ? 0 : 3, it == 4 ? 0 : 5};
    for (int r = 0; r < kWorkers; ++r) {
      for (int64_t i = 0; i < kN; ++i) {
        grads[r][i] = std::cos(1.7f * i + 0.3f * r + it) * (r == 1 ? 1.f : 1e7f) *
                      (r == 2 ? -1.f : 1.f);
      }
    }
    std::vector<float> sum = grads[0];
    for (int r = 1; r < kWorkers; ++r) {
      for (int64_t i = 0; i < kN; ++i) sum[i] += grads[r][i];
    }
    if (it != 4) {
      ASSERT_TRUE((*reference)->Apply(it, 10, sum, absl::MakeSpan(expected)).ok());
    }
    // The arrival order: by rank, reverse rank order (chunks reversed too),
    // or chunk by chunk with the ranks reversed.
    std::vector<Arrival> order;
    for (int r = 0; r < kWorkers; ++r) {
      for (size_t c = 0; c < chunks.size(); ++c) order.push_back({r, c});
    }
    if (it % 3 == 1) std::reverse(order.begin(), order.end());
    if (it % 3 == 2) {
      std::stable_sort(order.begin(), order.end(), [](const Arrival& x, const Arrival& y) {
        return x.chunk != y.chunk ? x.chunk < y.chunk : x.rank > y.rank;
      });
    }
    std::vector<int> pushed(chunks.size(), 0);
    for (const Arrival& p : order) {
      const Chunk& chunk = chunks[p.chunk];
      const absl::Span<const float> grad =
          absl::MakeConstSpan(grads[p.rank]).subspan(chunk.offset, chunk.length);
      ASSERT_TRUE(
          Push(server, p.rank, it, chunk.key, chunk.chunk, samples[p.rank], grad).ok());
      if (++pushed[p.chunk] < kWorkers) continue;
      // Complete: the chunk is at the next version with the reference's bits.
      std::vector<float> got(chunk.length);
      const ChunkOut out[] = {{chunk.key, chunk.chunk, absl::MakeSpan(got)}};
      auto version = PullChunks(server, it + 1, absl::InfinitePast(), out);
      ASSERT_TRUE(version.ok()) << version.status();
      EXPECT_EQ(*version, it + 1);
      for (int64_t i = 0; i < chunk.length; ++i) {
        ASSERT_EQ(got[i], expected[chunk.offset + i])
            << "iteration " << it << " element " << chunk.offset + i;
      }
    }
    ASSERT_EQ(server.version(), it + 1);
    EXPECT_EQ(server.held_elements(), 0);
    std::vector<float> params(kN);
    ASSERT_TRUE(Pull(server, it + 1, absl::InfinitePast(), absl::MakeSpan(params)).ok());
    for (int64_t i = 0; i < kN; ++i) {
      ASSERT_EQ(params[i], expected[i]) << "iteration " << it << " element " << i;
    }
  }
  EXPECT_NE(expected, initial);
}

// A gradient element that depends on the iteration, the rank and the
// element, of magnitudes from 1/2 to 64, so that a sum's bits depend on
// the order its terms are added in.
float GradientElement(int64_t iteration, int rank, int64_t element) {
  uint64_t h = static_cast<uint64_t>(iteration) * 0x9E3779B97F4A7C15ull ^
               static_cast<uint64_t>(rank) * 0xC2B2AE3D27D4EB4Full ^
               static_cast<uint64_t>(element) * 0x165667B19E3779F9ull;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  const float unit = static_cast<float>(h >> 40) / static_cast<float>(1 << 24) - 0.5f;
  return unit * static_cast<float>(1 << (h % 8));
}

// A model for the concurrency tests, the chunks of its layout and its
// messages (runs of 1 to 3 consecutive chunks, as a worker's buckets).
struct ConcurrencyCase {
  std::vector<ParamSpec> signature;
  int64_t chunk_elements = 0;
  int device_threads = 1;
  int64_t iterations = 0;
  int64_t ssp = -1;  // -1: sync; else ssp:S with this S

  struct ChunkRef {
    int key;
    int64_t chunk;
    int64_t offset;  // in the flat layout
    int64_t length;
  };
  std::vector<ChunkRef> Chunks() const {
    std::vector<ChunkRef> out;
    int64_t offset = 0;
    for (size_t key = 0; key < signature.size(); ++key) {
      const int64_t n = NumElements(signature[key].shape);
      for (int64_t c = 0; c < ChunkCount(n, chunk_elements); ++c) {
        const int64_t length = std::min(chunk_elements, n - c * chunk_elements);
        out.push_back({static_cast<int>(key), c, offset + c * chunk_elements, length});
      }
      offset += n;
    }
    return out;
  }
  std::vector<std::vector<ChunkRef>> Messages() const {
    std::vector<std::vector<ChunkRef>> out;
    const std::vector<ChunkRef> chunks = Chunks();
    for (size_t c = 0; c < chunks.size();) {
      const size_t n = std::min(chunks.size() - c, 1 + out.size() % 3);
      out.emplace_back(chunks.begin() + c, chunks.begin() + c + n);
      c += n;
    }
    return out;
  }
  int64_t NumParameters() const {
    int64_t n = 0;
    for (const ParamSpec& spec : signature) n += NumElements(spec.shape);
    return n;
  }
};

constexpr int kConcurrentWorkers = 4;

ParameterServerOptions ConcurrencyOptions(const ConcurrencyCase& c) {
  ParameterServerOptions options;
  options.num_workers = kConcurrentWorkers;
  options.chunk_elements = c.chunk_elements;
  options.optimizer.sgd.lr = 0.01f;
  options.optimizer.sgd.momentum = 0.9f;
  options.optimizer.sgd.weight_decay = 1e-3f;
  options.optimizer.sgd.nesterov = true;
  if (c.ssp >= 0) {
    options.consistency = SspConsistency(c.ssp).value();
  }
  return options;
}

std::unique_ptr<ParameterServer> MakeConcurrencyServer(const ConcurrencyCase& c,
                                                       CpuDevice* device) {
  std::vector<float> initial(c.NumParameters());
  for (size_t i = 0; i < initial.size(); ++i) initial[i] = GradientElement(-1, 0, i);
  auto server = ParameterServer::Create(ConcurrencyOptions(c), c.signature, initial, device);
  EXPECT_TRUE(server.ok()) << server.status();
  for (int rank = 0; rank < kConcurrentWorkers; ++rank) {
    EXPECT_TRUE((*server)->Register(absl::StrCat("w", rank), c.signature, rank).ok());
  }
  return std::move(server).value();
}

// Worker `rank`'s gradient of `iteration`, flat.
std::vector<float> WorkerGradient(const ConcurrencyCase& c, int64_t iteration, int rank) {
  std::vector<float> g(c.NumParameters());
  for (size_t i = 0; i < g.size(); ++i) g[i] = GradientElement(iteration, rank, i);
  return g;
}

absl::Status PushMessage(ParameterServer& server, int rank, int64_t iteration,
                         const std::vector<float>& gradient,
                         const std::vector<ConcurrencyCase::ChunkRef>& message) {
  std::vector<ChunkData> chunks;
  for (const ConcurrencyCase::ChunkRef& ref : message) {
    chunks.push_back(
        {ref.key, ref.chunk, absl::MakeConstSpan(gradient).subspan(ref.offset, ref.length)});
  }
  return PushChunks(server, rank, iteration, /*num_samples=*/rank + 1, chunks);
}

std::vector<float> AllParams(ParameterServer& server) {
  std::vector<float> out(server.num_parameters());
  EXPECT_TRUE(Pull(server, 0, absl::InfiniteFuture(), absl::MakeSpan(out)).ok());
  return out;
}

// One thread per worker pushing its messages in a random order each
// iteration, and pullers taking views (some held across later updates) of
// random chunks at each next version, all at once.
// With `captured`, a thread also asks for the state every few versions
// (CaptureState) while the workers push, and collects what it gets.
std::vector<float> TrainConcurrently(const ConcurrencyCase& c, uint32_t seed,
                                     std::vector<ParameterServer::State>* captured = nullptr) {
  CpuDevice device(0, c.device_threads);
  std::unique_ptr<ParameterServer> server = MakeConcurrencyServer(c, &device);
  const std::vector<std::vector<ConcurrencyCase::ChunkRef>> messages = c.Messages();
  const std::vector<ConcurrencyCase::ChunkRef> all_chunks = c.Chunks();
  std::vector<std::thread> threads;
  absl::Mutex captured_mu;
  int64_t requested = 0;
  if (captured != nullptr) {
    threads.emplace_back([&] {
      for (int64_t v = 3; v < c.iterations; v += 5) {
        EXPECT_TRUE(server->WaitForVersion(v, absl::Now() + absl::Seconds(60)).ok());
        {
          absl::MutexLock lock(&captured_mu);
          ++requested;
        }
        server->CaptureState([&](ParameterServer::State state) {
          absl::MutexLock lock(&captured_mu);
          captured->push_back(std::move(state));
        });
      }
    });
  }
  for (int rank = 0; rank < kConcurrentWorkers; ++rank) {
    threads.emplace_back([&, rank] {
      std::mt19937 rng(seed * 131 + rank);
      std::vector<size_t> order(messages.size());
      for (int64_t it = 0; it < c.iterations; ++it) {
        // Under ssp:S a worker begins step it once version it - S exists.
        if (c.ssp >= 0 && it - c.ssp > 0) {
          EXPECT_TRUE(server->WaitForVersion(it - c.ssp, absl::Now() + absl::Seconds(60)).ok());
        }
        const std::vector<float> gradient = WorkerGradient(c, it, rank);
        for (size_t m = 0; m < order.size(); ++m) order[m] = m;
        std::shuffle(order.begin(), order.end(), rng);
        for (const size_t m : order) {
          const absl::Status s = PushMessage(*server, rank, it, gradient, messages[m]);
          EXPECT_TRUE(s.ok()) << "rank " << rank << " iteration " << it << ": " << s;
          if (!s.ok()) return;
        }
        if (c.ssp < 0) {
          EXPECT_TRUE(server->WaitForVersion(it + 1, absl::Now() + absl::Seconds(60)).ok());
        }
      }
    });
  }
  constexpr int kPullers = 2;
  for (int p = 0; p < kPullers; ++p) {
    threads.emplace_back([&, p] {
      std::mt19937 rng(seed * 977 + p);
      struct Held {
        ParameterServer::ChunkViews views;
        std::vector<std::vector<float>> copies;
      };
      std::vector<Held> held;
      for (int64_t v = 1; v <= c.iterations; ++v) {
        std::vector<ParameterServer::ChunkId> ids;
        for (int i = 0; i < 3; ++i) {
          const ConcurrencyCase::ChunkRef& ref = all_chunks[rng() % all_chunks.size()];
          ids.push_back({ref.key, ref.chunk});
        }
        auto views = server->PullChunkViews(v, absl::Now() + absl::Seconds(60), ids);
        EXPECT_TRUE(views.ok()) << views.status();
        if (!views.ok()) return;
        EXPECT_GE(views->version, v);
        if (v % 4 == p) {
          Held h;
          for (absl::Span<const float> view : views->chunks) {
            h.copies.emplace_back(view.begin(), view.end());
          }
          h.views = std::move(views).value();
          held.push_back(std::move(h));
        }
      }
      // Held across every later update: still unchanged (copy on write).
      for (const Held& h : held) {
        for (size_t i = 0; i < h.copies.size(); ++i) {
          const std::vector<float> now(h.views.chunks[i].begin(), h.views.chunks[i].end());
          EXPECT_TRUE(BitIdentical(now, h.copies[i]));
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(server->version(), c.iterations);
  EXPECT_EQ(server->held_elements(), 0);
  if (captured != nullptr) {
    absl::MutexLock lock(&captured_mu);
    EXPECT_EQ(static_cast<int64_t>(captured->size()), requested);
  }
  return AllParams(*server);
}

// The same pushes one at a time: each iteration rank 0's messages in order,
// then rank 1's, ... With `by_version`, the parameters of every version.
std::vector<float> TrainSerially(const ConcurrencyCase& c,
                                 std::vector<std::vector<float>>* by_version = nullptr) {
  CpuDevice device(0, 1);
  std::unique_ptr<ParameterServer> server = MakeConcurrencyServer(c, &device);
  if (by_version != nullptr) by_version->push_back(AllParams(*server));
  for (int64_t it = 0; it < c.iterations; ++it) {
    for (int rank = 0; rank < kConcurrentWorkers; ++rank) {
      const std::vector<float> gradient = WorkerGradient(c, it, rank);
      for (const auto& message : c.Messages()) {
        EXPECT_TRUE(PushMessage(*server, rank, it, gradient, message).ok());
      }
    }
    if (by_version != nullptr) by_version->push_back(AllParams(*server));
  }
  EXPECT_EQ(server->version(), c.iterations);
  return AllParams(*server);
}

TEST(ParameterServerConcurrencyTest, ConcurrentPushesAndPullsEqualOneThreadBitForBit) {
  // Small chunks (17 of them, one of an empty tensor): many messages per
  // iteration, so pushes of different chunks and of the same chunk from
  // different workers interleave in every way.
  ConcurrencyCase small;
  small.signature = {{"w1", {16, 40}, DType::kF32},
                     {"b1", {40}, DType::kF32},
                     {"empty", {0}, DType::kF32},
                     {"w2", {7, 33}, DType::kF32},
                     {"b2", {7}, DType::kF32}};
  small.chunk_elements = 64;
  small.iterations = 40;
  const std::vector<float> reference = TrainSerially(small);
  for (uint32_t seed = 1; seed <= 3; ++seed) {
    EXPECT_TRUE(BitIdentical(TrainConcurrently(small, seed), reference)) << "seed " << seed;
  }
}

// Stale synchronous parallel: workers running up to S iterations apart,
// pushing each iteration's messages in random orders from their threads,
// with pulls and state captures in flight, give the bits of the serial sync
// run (the iterations are applied in order), and every captured state is
// that run's at its version.
TEST(ParameterServerConcurrencyTest, SspWorkersAheadEqualOneThreadSyncBitForBit) {
  ConcurrencyCase c;
  c.signature = {{"w1", {16, 40}, DType::kF32},
                 {"b1", {40}, DType::kF32},
                 {"empty", {0}, DType::kF32},
                 {"w2", {7, 33}, DType::kF32},
                 {"b2", {7}, DType::kF32}};
  c.chunk_elements = 64;
  c.iterations = 40;
  std::vector<std::vector<float>> by_version;
  const std::vector<float> reference = TrainSerially(c, &by_version);
  for (const int64_t ssp : {0, 1, 3}) {
    c.ssp = ssp;
    for (uint32_t seed = 1; seed <= 2; ++seed) {
      std::vector<ParameterServer::State> captured;
      EXPECT_TRUE(BitIdentical(TrainConcurrently(c, seed, &captured), reference))
          << "ssp:" << ssp << " seed " << seed;
      for (const ParameterServer::State& state : captured) {
        ASSERT_LT(state.version, static_cast<int64_t>(by_version.size()));
        EXPECT_TRUE(BitIdentical(state.parameters, by_version[state.version]))
            << "ssp:" << ssp << " seed " << seed << " state of version " << state.version;
      }
    }
  }
}

TEST(ParameterServerConcurrencyTest, ChunksBigEnoughToSplitOverTheDevicesThreads) {
  // Chunks of 2^16 elements on a device of two threads: the SGD kernel
  // splits each chunk's update, one chunk's at a time.
  ConcurrencyCase big;
  big.signature = {{"w", {3, 70000}, DType::kF32}, {"b", {3}, DType::kF32}};
  big.chunk_elements = 1 << 16;
  big.device_threads = 2;
  big.iterations = 6;
  EXPECT_TRUE(BitIdentical(TrainConcurrently(big, 7), TrainSerially(big)));
}

TEST(ParameterServerConcurrencyTest, ConcurrentMessagesOfOneWorkerAreAllOrNothing) {
  // One worker, chunks c0, c1, c2; each round two messages race: with a
  // chunk in common (exactly one is refused kAlreadyExists) or with
  // different sample counts (exactly one is refused kFailedPrecondition);
  // the winner's chunks are added whole, the loser's not at all, as a
  // serial replay of the winners shows bit for bit.
  // Chunks of 2^15 elements: checking a message's values takes long
  // enough that both messages often pass the first check before either
  // claims its chunks.
  constexpr int64_t kChunk = 1 << 15;
  const std::vector<ParamSpec> signature = {{"w", {3 * kChunk}, DType::kF32}};
  ParameterServerOptions options;
  options.chunk_elements = kChunk;
  options.optimizer.sgd.lr = 0.1f;
  options.optimizer.sgd.momentum = 0.5f;
  const std::vector<float> initial(3 * kChunk, 1.f);
  CpuDevice device(0, 1);
  auto raced = ParameterServer::Create(options, signature, initial, &device);
  auto replay = ParameterServer::Create(options, signature, initial, &device);
  ASSERT_TRUE(raced.ok() && replay.ok());
  ASSERT_TRUE((*raced)->Register("w", signature).ok());
  ASSERT_TRUE((*replay)->Register("w", signature).ok());
  struct Message {
    std::vector<int64_t> chunks;
    int64_t samples;
  };
  auto push = [&](ParameterServer& server, int64_t it, const Message& m, float value) {
    std::vector<float> data(kChunk * m.chunks.size(), value);
    std::vector<ChunkData> chunks;
    for (size_t i = 0; i < m.chunks.size(); ++i) {
      chunks.push_back({0, m.chunks[i], absl::MakeConstSpan(data).subspan(kChunk * i, kChunk)});
    }
    return PushChunks(server, 0, it, m.samples, chunks);
  };
  constexpr int kRounds = 200;
  int first_won = 0;
  for (int64_t it = 0; it < kRounds; ++it) {
    const bool common_chunk = it % 2 == 0;
    const Message a = common_chunk ? Message{{0, 1}, 2} : Message{{0}, 2};
    const Message b = common_chunk ? Message{{1, 2}, 2} : Message{{1, 2}, 3};
    const float a_value = 0.25f + 0.001f * it, b_value = -0.5f - 0.002f * it;
    absl::Status sa, sb;
    absl::Notification go;
    std::thread ta([&] {
      go.WaitForNotification();
      sa = push(**raced, it, a, a_value);
    });
    std::thread tb([&] {
      go.WaitForNotification();
      sb = push(**raced, it, b, b_value);
    });
    go.Notify();
    ta.join();
    tb.join();
    ASSERT_NE(sa.ok(), sb.ok()) << "round " << it << ": " << sa << " / " << sb;
    const absl::Status& lost = sa.ok() ? sb : sa;
    EXPECT_EQ(lost.code(), common_chunk ? absl::StatusCode::kAlreadyExists
                                        : absl::StatusCode::kFailedPrecondition)
        << lost;
    const Message& won = sa.ok() ? a : b;
    first_won += sa.ok();
    Message rest{{}, won.samples};
    for (int64_t c = 0; c < 3; ++c) {
      if (std::find(won.chunks.begin(), won.chunks.end(), c) == won.chunks.end()) {
        rest.chunks.push_back(c);
      }
    }
    const float won_value = sa.ok() ? a_value : b_value;
    ASSERT_TRUE(push(**raced, it, rest, 1.f).ok());
    ASSERT_TRUE(push(**replay, it, won, won_value).ok());
    ASSERT_TRUE(push(**replay, it, rest, 1.f).ok());
    ASSERT_EQ((*raced)->version(), it + 1);
  }
  std::printf("the first message won %d of %d races\n", first_won, kRounds);
  EXPECT_TRUE(BitIdentical(AllParams(**raced), AllParams(**replay)));
}

// Whether two push events of different workers ever overlapped in time.
class PushOverlapObserver final : public EventObserver {
 public:
  void OnEvent(const TimedEvent& event) override {
    if (event.kind != EventKind::kServerPush) return;
    absl::MutexLock lock(&mu_);
    const int lane = event.lane == ServerPushLane(0) ? 0 : 1;
    for (const auto& [start, end] : recent_[1 - lane]) {
      overlapped_ |= start < event.end_ns && event.start_ns < end;
    }
    // An event that overlaps this one ends after it starts, so is reported
    // within the next iteration's pushes or sees this one itself.
    recent_[lane].push_back({event.start_ns, event.end_ns});
    if (recent_[lane].size() > 64) recent_[lane].erase(recent_[lane].begin());
  }
  bool overlapped() const {
    absl::MutexLock lock(&mu_);
    return overlapped_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::pair<int64_t, int64_t>> recent_[2] ABSL_GUARDED_BY(mu_);
  bool overlapped_ ABSL_GUARDED_BY(mu_) = false;
};

TEST(ParameterServerConcurrencyTest, PushesOfDifferentChunksRunAtOnce) {
  // Two workers push a model of 16 chunks from two threads, in opposite
  // orders, so at most moments they push different chunks. Each push event
  // is timed on the real clock from holding the bookkeeping lock to the
  // end of its sum; under one server-wide lock no two could overlap. On a
  // loaded machine the two threads may not run at once for a while, so
  // iterations go on (up to 20 s) until two pushes overlap.
  PushOverlapObserver observer;
  ParameterServerOptions options;
  options.num_workers = 2;
  options.chunk_elements = 1 << 16;
  options.observer = &observer;
  options.clock = Clock::Real();
  constexpr int64_t kChunks = 16;
  const std::vector<ParamSpec> signature = {{"w", {kChunks, 1 << 16}, DType::kF32}};
  CpuDevice device(0, 1);
  auto server =
      ParameterServer::Create(options, signature, std::vector<float>(kChunks << 16, 0.f), &device);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE((*server)->Register("a", signature, 0).ok());
  ASSERT_TRUE((*server)->Register("b", signature, 1).ok());
  const std::vector<float> gradient(1 << 16, 1e-3f);
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  int64_t it = 0;
  for (; !observer.overlapped() && absl::Now() < deadline; ++it) {
    auto pusher = [&](int rank) {
      for (int64_t i = 0; i < kChunks; ++i) {
        const int64_t c = rank == 0 ? i : kChunks - 1 - i;
        EXPECT_TRUE(Push(**server, rank, it, 0, c, 1, gradient).ok());
      }
    };
    std::thread t0(pusher, 0), t1(pusher, 1);
    t0.join();
    t1.join();
    ASSERT_EQ((*server)->version(), it + 1);
  }
  std::printf("two pushes overlapped after %lld iterations\n", static_cast<long long>(it));
  EXPECT_TRUE(observer.overlapped());
}

// --- dynamic loss scaling ---------------------------------------------------

std::unique_ptr<ParameterServer> MakeLossScalingServer(CpuDevice* device, int workers,
                                                       float initial, int64_t growth_interval) {
  ParameterServerOptions options;
  options.num_workers = workers;
  options.chunk_elements = 4;
  options.optimizer.sgd.lr = 1.f;
  options.optimizer.sgd.momentum = 0.5f;
  options.loss_scale.dynamic = true;
  options.loss_scale.initial = initial;
  options.loss_scale.growth_interval = growth_interval;
  auto server = ParameterServer::Create(options, Signature(), Initial(), device);
  EXPECT_TRUE(server.ok()) << server.status();
  return std::move(server).value();
}

TEST_F(ParameterServerTest, LossScalingDividesTheScaledGradientExactly) {
  // Gradients pushed times the scale (8) give the unscaled server's
  // parameters bit for bit, momentum included.
  auto scaled = MakeLossScalingServer(&device_, 2, 8.f, 1000);
  ParameterServerOptions plain_options;
  plain_options.num_workers = 2;
  plain_options.chunk_elements = 4;
  plain_options.optimizer.sgd.lr = 1.f;
  plain_options.optimizer.sgd.momentum = 0.5f;
  CpuDevice plain_device(0, 1);
  auto plain = ParameterServer::Create(plain_options, Signature(), Initial(), &plain_device);
  ASSERT_TRUE(plain.ok());
  for (auto* server : {scaled.get(), plain->get()}) {
    ASSERT_TRUE(server->Register("a", Signature()).ok());
    ASSERT_TRUE(server->Register("b", Signature()).ok());
  }
  EXPECT_EQ(scaled->loss_scale().scale, 8.f);
  EXPECT_EQ((*plain)->loss_scale().scale, 0.f);
  for (int64_t it = 0; it < 3; ++it) {
    PushAll(*scaled, 0, it, 8 * 0.3f * (it + 1), 3);
    PushAll(*scaled, 1, it, 8 * -0.7f, 5);
    PushAll(**plain, 0, it, 0.3f * (it + 1), 3);
    PushAll(**plain, 1, it, -0.7f, 5);
  }
  EXPECT_EQ(Params(*scaled), Params(**plain));
}

TEST_F(ParameterServerTest, AnOverflowOnOneWorkerSkipsTheIterationAndHalvesTheScale) {
  auto server = MakeLossScalingServer(&device_, 2, 1024.f, 2);
  ASSERT_TRUE(server->Register("a", Signature()).ok());
  ASSERT_TRUE(server->Register("b", Signature()).ok());
  // Iteration 0: clean.
  PushAll(*server, 0, 0, 1024.f, 4);
  PushAll(*server, 1, 0, 1024.f, 4);
  ASSERT_EQ(server->version(), 1);
  const std::vector<float> after_first = Params(*server);
  EXPECT_EQ(server->loss_scale().scale, 1024.f);  // 1 clean iteration of 2
  // Iteration 1: rank 1 pushes first, is held for rank 0's turn, and rank 0
  // overflows (an infinity in one chunk, NaN in the rest, as the trainer
  // poisons its gradient): nothing is applied, nothing held stays.
  PushAll(*server, 1, 1, 512.f, 4);
  EXPECT_GT(server->held_elements(), 0);
  PushAll(*server, 0, 1, std::numeric_limits<float>::quiet_NaN(), 4);
  ASSERT_EQ(server->version(), 2);  // the version advances, unchanged
  EXPECT_EQ(Params(*server), after_first);
  EXPECT_EQ(server->held_elements(), 0);
  ParameterServer::LossScale scale = server->loss_scale();
  EXPECT_EQ(scale.scale, 512.f);
  EXPECT_EQ(scale.skipped_iterations, 1);
  EXPECT_EQ(scale.version, 2);
  for (float x : Params(*server)) EXPECT_TRUE(std::isfinite(x));
  // Two clean iterations: the scale doubles back; the updates resume, and
  // the momentum was not touched by the skipped one.
  PushAll(*server, 0, 2, 512.f, 4);
  PushAll(*server, 1, 2, 512.f, 4);
  EXPECT_EQ(server->loss_scale().scale, 512.f);
  EXPECT_NE(Params(*server), after_first);
  PushAll(*server, 0, 3, 512.f, 4);
  PushAll(*server, 1, 3, 512.f, 4);
  scale = server->loss_scale();
  EXPECT_EQ(scale.scale, 1024.f);
  EXPECT_EQ(scale.skipped_iterations, 1);
  for (float x : Params(*server)) EXPECT_TRUE(std::isfinite(x));
}

TEST_F(ParameterServerTest, AnInfinityInOneChunkSkipsThatChunksUpdate) {
  // A worker that does not poison every chunk (not ours) still cannot put
  // a non-finite value into the parameters: its chunk is skipped, and the
  // iteration counts as an overflow.
  auto server = MakeLossScalingServer(&device_, 1, 4.f, 100);
  ASSERT_TRUE(server->Register("a", Signature()).ok());
  const std::vector<float> bad = {1, std::numeric_limits<float>::infinity(), 1, 1};
  const std::vector<float> tail = {4, 4};
  const std::vector<float> bias = {4, 4};
  ASSERT_TRUE(Push(*server, 0, 0, 0, 0, 1, bad).ok());
  ASSERT_TRUE(Push(*server, 0, 0, 0, 1, 1, tail).ok());
  ASSERT_TRUE(Push(*server, 0, 0, 1, 0, 1, bias).ok());
  ASSERT_EQ(server->version(), 1);
  const std::vector<float> p = Params(*server);
  const std::vector<float> initial = Initial();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(p[i], initial[i]) << i;  // skipped
  for (int i = 4; i < 8; ++i) EXPECT_EQ(p[i], initial[i] - 1.f) << i;  // 4 / scale 4
  EXPECT_EQ(server->loss_scale().scale, 2.f);
}

TEST_F(ParameterServerTest, LossScalingOptionsAreChecked) {
  ParameterServerOptions options;
  options.loss_scale.dynamic = true;
  options.loss_scale.initial = 1000.f;
  EXPECT_THAT(ParameterServer::Create(options, &device_).status().message(),
              HasSubstr("power of two"));
  options.loss_scale.initial = 1024.f;
  options.loss_scale.growth_interval = 0;
  EXPECT_THAT(ParameterServer::Create(options, &device_).status().message(),
              HasSubstr("growth interval"));
  options.loss_scale.growth_interval = 10;
  options.consistency = ParseConsistency("async").value();
  EXPECT_THAT(ParameterServer::Create(options, &device_).status().message(),
              HasSubstr("needs sync consistency"));
  options.consistency = ParseConsistency("sync").value();
  EXPECT_TRUE(ParameterServer::Create(options, &device_).ok());
}

// A captured state carries the loss scale, and a server resumed from it
// goes on where the saved one was: the next overflow halves that scale.
TEST_F(ParameterServerTest, LossScaleSurvivesACaptureAndResume) {
  auto server = MakeLossScalingServer(&device_, 1, 1024.f, 2);
  ASSERT_TRUE(server->Register("a", Signature()).ok());
  PushAll(*server, 0, 0, 1.f, 1);
  PushAll(*server, 0, 1, 1.f, 1);  // two clean: 2048
  PushAll(*server, 0, 2, std::numeric_limits<float>::infinity(), 1);  // 1024, 1 skipped
  PushAll(*server, 0, 3, 1.f, 1);  // one clean iteration
  ParameterServer::State state;
  server->CaptureState([&](ParameterServer::State s) { state = std::move(s); });
  EXPECT_EQ(state.loss_scale, 1024.f);
  EXPECT_EQ(state.loss_scale_clean_iterations, 1);
  EXPECT_EQ(state.loss_scale_skipped_iterations, 1);
  ParameterServerOptions options;
  options.num_workers = 1;
  options.chunk_elements = 4;
  options.optimizer.sgd.lr = 1.f;
  options.optimizer.sgd.momentum = 0.5f;
  options.loss_scale.dynamic = true;
  options.loss_scale.initial = 65536.f;  // not used: the saved scale is
  options.loss_scale.growth_interval = 2;
  CpuDevice device(0, 1);
  auto resumed = ParameterServer::CreateFromState(options, state, &device);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  ASSERT_TRUE((*resumed)->Register("a", Signature()).ok());
  EXPECT_EQ((*resumed)->loss_scale().scale, 1024.f);
  PushAll(**resumed, 0, 4, 1.f, 1);  // the second clean in a row: doubles
  EXPECT_EQ((*resumed)->loss_scale().scale, 2048.f);
  EXPECT_EQ((*resumed)->loss_scale().skipped_iterations, 1);
  // A saved scale that is no power of two is refused.
  state.loss_scale = 1000.f;
  EXPECT_EQ(ParameterServer::CreateFromState(options, state, &device).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Without loss scaling a non-finite push is still refused, naming it.
TEST_F(ParameterServerTest, WithoutLossScalingANonFinitePushIsStillRefused) {
  auto server = MakeServer(1);
  ASSERT_TRUE(server->Register("a", Signature()).ok());
  const std::vector<float> bad = {1, std::numeric_limits<float>::infinity(), 1, 1};
  const absl::Status s = Push(*server, 0, 0, 0, 0, 1, bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("non-finite"));
}

// A sum-only server (--optimizer=none) of two workers over MakeServer's
// model (chunks of 4: key 0 in chunks 0 and 1, key 1 in one), both
// registered, under `consistency` (sync when null).
std::unique_ptr<ParameterServer> MakeSumOnlyServer(
    CpuDevice* device, std::shared_ptr<const Consistency> consistency = nullptr) {
  ParameterServerOptions options;
  options.num_workers = 2;
  options.chunk_elements = 4;
  options.optimizer.kind = kMeanGradientOptimizer;
  if (consistency != nullptr) options.consistency = std::move(consistency);
  auto server = ParameterServer::Create(options, Signature(), Initial(), device);
  EXPECT_TRUE(server.ok()) << server.status();
  EXPECT_TRUE((*server)->Register("w0", Signature(), 0).ok());
  EXPECT_TRUE((*server)->Register("w1", Signature(), 1).ok());
  return std::move(server).value();
}

// What version it + 1 of a sum-only server holds after both ranks pushed
// iteration `it` with PushChunkOf (samples 3 and 4): the rank-order sum
// times the float nearest 1/7, flat.
std::vector<float> MeanGradientOf(int64_t it) {
  std::vector<float> mean;
  for (const auto& [key, chunk] : AllChunks()) {
    const int64_t n = key == 0 && chunk == 0 ? 4 : 2;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t at = key * 100 + chunk * 10 + i;
      mean.push_back((1.f / 7.f) * (GradientOf(it, 0, at) + GradientOf(it, 1, at)));
    }
  }
  return mean;
}

// Each version after 0 is its iteration's mean gradient over the global
// batch (weighted by the workers' samples), never parameters: version 0
// stays the initial values, each chunk is published as soon as both ranks
// pushed it, the next version is the next iteration's mean alone, and an
// iteration of no samples publishes zeros rather than the last gradient.
TEST_F(ParameterServerTest, SumOnlyPublishesTheSamplesWeightedMeanGradient) {
  auto server = MakeSumOnlyServer(&device_);
  EXPECT_EQ(Params(*server), Initial());
  PushIteration(*server, 0, 0);
  PushChunkOf(*server, 1, 0, 0, 1);
  // Chunk (0, 1) is out; the others wait for rank 1.
  EXPECT_TRUE(server->HasChunks(1, {{0, 1}}));
  EXPECT_FALSE(server->HasChunks(1, {{0, 0}}));
  std::vector<float> chunk01(2);
  ASSERT_TRUE(PullChunks(*server, 1, absl::InfiniteFuture(), {{0, 1, absl::MakeSpan(chunk01)}})
                  .ok());
  const std::vector<float> mean0 = MeanGradientOf(0);
  EXPECT_TRUE(BitIdentical(chunk01, {mean0[4], mean0[5]}));
  PushChunkOf(*server, 1, 0, 1, 0);
  PushChunkOf(*server, 1, 0, 0, 0);
  ASSERT_EQ(server->version(), 1);
  std::vector<float> out(8);
  ASSERT_TRUE(Pull(*server, 1, absl::InfiniteFuture(), absl::MakeSpan(out)).ok());
  EXPECT_TRUE(BitIdentical(out, mean0));
  // The sums over 3 and 4 samples make the mean over 7.
  EXPECT_NEAR(out[0], (GradientOf(0, 0, 0) + GradientOf(0, 1, 0)) / 7.0, 1e-7);
  // Version 0, exactly: still the initial values.
  auto views = server->PullChunkViews(0, absl::InfiniteFuture(), {{0, 0}, {0, 1}, {1, 0}},
                                      /*exact=*/true);
  ASSERT_TRUE(views.ok()) << views.status();
  std::vector<float> version0;
  for (absl::Span<const float> chunk : views->chunks) {
    version0.insert(version0.end(), chunk.begin(), chunk.end());
  }
  EXPECT_EQ(version0, Initial());

  PushIteration(*server, 1, 1);
  PushIteration(*server, 0, 1);
  ASSERT_TRUE(Pull(*server, 2, absl::InfiniteFuture(), absl::MakeSpan(out)).ok());
  EXPECT_TRUE(BitIdentical(out, MeanGradientOf(1)));

  const std::vector<float> g(4, 1.f), g2(2, 1.f);
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(PushChunks(*server, rank, 2, /*num_samples=*/0,
                           {{0, 0, g}, {0, 1, g2}, {1, 0, g2}})
                    .ok());
  }
  ASSERT_TRUE(Pull(*server, 3, absl::InfiniteFuture(), absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, std::vector<float>(8, 0.f));
}

// Under ssp:S each version is still one iteration's mean, whatever order
// the iterations in flight are pushed in.
TEST_F(ParameterServerTest, SumOnlyUnderSspPublishesEachIterationsMean) {
  auto server = MakeSumOnlyServer(&device_, SspConsistency(1).value());
  PushIteration(*server, 0, 0);
  PushIteration(*server, 0, 1);  // one ahead
  PushIteration(*server, 1, 1);
  EXPECT_EQ(server->version(), 0);
  PushIteration(*server, 1, 0);
  ASSERT_EQ(server->version(), 2);
  std::vector<float> out(8);
  ASSERT_TRUE(Pull(*server, 2, absl::InfiniteFuture(), absl::MakeSpan(out)).ok());
  EXPECT_TRUE(BitIdentical(out, MeanGradientOf(1)));
  auto views = server->PullChunkViews(1, absl::InfiniteFuture(), {{0, 0}, {0, 1}, {1, 0}},
                                      /*exact=*/true);
  ASSERT_TRUE(views.ok()) << views.status();
  std::vector<float> version1;
  for (absl::Span<const float> chunk : views->chunks) {
    version1.insert(version1.end(), chunk.begin(), chunk.end());
  }
  EXPECT_TRUE(BitIdentical(version1, MeanGradientOf(0)));
}

// A sum-only server's state has no momentum and holds the newest version's
// values; resumed from it, the server serves that version and goes on. The
// modes in which a version would not be one iteration's mean are refused.
TEST_F(ParameterServerTest, SumOnlyResumesWithoutMomentumAndRefusesAsyncAndLossScaling) {
  auto server = MakeSumOnlyServer(&device_);
  PushIteration(*server, 0, 0);
  PushIteration(*server, 1, 0);
  std::vector<ParameterServer::State> captured;
  server->CaptureState([&](ParameterServer::State s) { captured.push_back(std::move(s)); });
  ASSERT_EQ(captured.size(), 1u);
  EXPECT_EQ(captured[0].version, 1);
  EXPECT_TRUE(captured[0].momentum.empty());
  EXPECT_TRUE(BitIdentical(captured[0].parameters, MeanGradientOf(0)));

  ParameterServerOptions options = server->options();
  auto resumed = ParameterServer::CreateFromState(options, captured[0], &device_);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  ASSERT_TRUE((*resumed)->Register("w0", Signature(), 0).ok());
  ASSERT_TRUE((*resumed)->Register("w1", Signature(), 1).ok());
  EXPECT_TRUE(BitIdentical(Params(**resumed), MeanGradientOf(0)));
  PushIteration(**resumed, 0, 1);
  PushIteration(**resumed, 1, 1);
  std::vector<float> out(8);
  ASSERT_TRUE(Pull(**resumed, 2, absl::InfiniteFuture(), absl::MakeSpan(out)).ok());
  EXPECT_TRUE(BitIdentical(out, MeanGradientOf(1)));
  ParameterServer::State with_momentum = captured[0];
  with_momentum.momentum.assign(8, 0.f);
  EXPECT_EQ(ParameterServer::CreateFromState(options, with_momentum, &device_).status().code(),
            absl::StatusCode::kInvalidArgument);

  options.consistency = AsyncConsistency();
  absl::Status s = ParameterServer::Create(options, &device_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("one worker's gradient instead of the mean"));
  options.consistency = SyncConsistency();
  options.loss_scale.dynamic = true;
  s = ParameterServer::Create(options, &device_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("previous iteration's mean gradient again"));
}

}  // namespace
}  // namespace ps::server
