#include "server/parameter_server.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/fake_observer.h"
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
    auto v = server.Pull(0, absl::InfiniteFuture(), absl::MakeSpan(out));
    EXPECT_TRUE(v.ok()) << v.status();
    return out;
  }

  CpuDevice device_{0, 1};
};

// Pushes a whole gradient of value `g` for worker `rank`.
void PushAll(ParameterServer& server, int rank, int64_t iteration, float g, int64_t samples) {
  for (int key = 0; key < 2; ++key) {
    const int64_t n = key == 0 ? 6 : 2;
    for (int64_t c = 0; c < server.NumChunks(key); ++c) {
      const int64_t len = std::min<int64_t>(4, n - c * 4);
      std::vector<float> grad(len, g);
      ASSERT_TRUE(server.Push(rank, iteration, key, c, samples, grad).ok());
    }
  }
}

TEST_F(ParameterServerTest, SumsWorkersAndScalesByGlobalBatch) {
  auto server = MakeServer(2);
  ASSERT_TRUE(server->Register("a", Signature()).ok());
  ASSERT_TRUE(server->Register("b", Signature()).ok());
  EXPECT_EQ(server->NumChunks(0), 2);  // 6 elements in chunks of 4
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
  EXPECT_EQ(server->Pull(1, absl::Now() + absl::Milliseconds(20), absl::MakeSpan(out))
                .status()
                .code(),
            absl::StatusCode::kDeadlineExceeded);
  std::thread pusher([&] { PushAll(*server, 0, 0, 1.f, 1); });
  auto version = server->Pull(1, absl::Now() + absl::Seconds(10), absl::MakeSpan(out));
  pusher.join();
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_EQ(*version, 1);
}

// Chunks of Initial() in the layout MakeServer's chunk size 4 gives: key 0
// in chunks [0, 4) and [4, 6), key 1 in one chunk.
std::vector<ParameterServer::ChunkData> InitialChunks(const std::vector<float>& values) {
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
  auto early = server.Pull(0, absl::Now() + absl::Milliseconds(10), absl::MakeSpan(out));
  EXPECT_EQ(early.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(early.status().message()), HasSubstr("incomplete"));
  std::vector<float> two(2, 1.f);
  EXPECT_EQ(server.Push(0, 0, 1, 0, 1, two).code(), absl::StatusCode::kFailedPrecondition);

  const std::vector<float> initial = Initial();
  const std::vector<ParameterServer::ChunkData> chunks = InitialChunks(initial);
  EXPECT_EQ(server.InitializeChunks(1, chunks).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(server.InitializeChunks(3, chunks).code(), absl::StatusCode::kNotFound);
  // A bad message adds nothing, a good one its chunks, a repeat is refused.
  const std::vector<float> with_nan = {1.f, NAN};
  const std::vector<ParameterServer::ChunkData> bad = {chunks[0], {1, 0, with_nan}};
  EXPECT_EQ(server.InitializeChunks(0, bad).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(server.InitializeChunks(0, {chunks[0], chunks[1]}).ok());
  EXPECT_FALSE(server.initialized());
  EXPECT_EQ(server.InitializeChunks(0, {chunks[0]}).code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(server.InitializeChunks(0, {chunks[2]}).ok());
  EXPECT_TRUE(server.initialized());
  EXPECT_EQ(Params(server), Initial());
  EXPECT_EQ(server.InitializeChunks(0, {chunks[2]}).code(), absl::StatusCode::kFailedPrecondition);
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
  ASSERT_TRUE(server.Pull(3, absl::InfiniteFuture(), absl::MakeSpan(params)).ok());
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
  ASSERT_TRUE(server->Push(0, 0, 0, 0, 3, four).ok());
  struct Case {
    const char* what;
    absl::Status status;
    absl::StatusCode code;
    const char* message;
  };
  std::vector<float> with_nan = {1.f, NAN};
  const Case cases[] = {
      {"unknown worker", server->Push(3, 0, 0, 1, 3, two), absl::StatusCode::kNotFound,
       "unregistered worker rank 3"},
      {"unknown key", server->Push(0, 0, 7, 0, 3, two), absl::StatusCode::kOutOfRange,
       "key 7 out of range"},
      {"chunk out of range", server->Push(0, 0, 0, 2, 3, two), absl::StatusCode::kOutOfRange,
       "chunk 2 of key 'fc.weight' out of range"},
      {"wrong length", server->Push(0, 0, 0, 1, 3, four), absl::StatusCode::kInvalidArgument,
       "needs 2 elements, got 4"},
      {"duplicate", server->Push(0, 0, 0, 0, 3, four), absl::StatusCode::kAlreadyExists,
       "already pushed"},
      {"stale iteration", server->Push(0, 5, 0, 1, 3, two), absl::StatusCode::kFailedPrecondition,
       "iteration 5 but the server is at iteration 0"},
      {"sample count changes", server->Push(0, 0, 0, 1, 4, two),
       absl::StatusCode::kFailedPrecondition, "claims 4 samples"},
      {"NaN", server->Push(0, 0, 1, 0, 3, with_nan), absl::StatusCode::kInvalidArgument,
       "non-finite"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(c.status.code(), c.code) << c.what << ": " << c.status;
    EXPECT_THAT(std::string(c.status.message()), HasSubstr(c.message)) << c.what;
  }
  // Finish the iteration: the update reflects only the good pushes.
  ASSERT_TRUE(server->Push(0, 0, 0, 1, 3, two).ok());
  ASSERT_TRUE(server->Push(0, 0, 1, 0, 3, two).ok());
  EXPECT_EQ(server->version(), 1);
  std::vector<float> expected = Initial();
  for (float& x : expected) x -= 1.f / 3.f;
  const std::vector<float> params = Params(*server);
  for (int i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(params[i], expected[i]) << i;
}

TEST_F(ParameterServerTest, ReportsEachPushMessageTheUpdateAndEachPull) {
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
  EXPECT_FALSE(server.Push(0, 1, 0, 0, 8, std::vector<float>(4, 1.f)).ok());
  EXPECT_TRUE(observer.events().empty());

  // Worker 1 first: one push message per chunk, then worker 0's, whose last
  // completes the iteration.
  PushAll(server, 1, 0, 1.f, 8);
  clock.Advance(100);
  PushAll(server, 0, 0, 2.f, 8);
  std::vector<TimedEvent> events = observer.events();
  std::vector<std::string> names = observer.names();
  ASSERT_EQ(events.size(), 2u * 3 + 1);
  const std::vector<std::string> first_tensors = {"fc.weight", "fc.weight", "fc.bias"};
  const std::vector<int64_t> bytes = {16, 8, 8};
  for (int i = 0; i < 6; ++i) {
    const int rank = i < 3 ? 1 : 0;
    EXPECT_EQ(events[i].kind, EventKind::kServerPush) << i;
    EXPECT_EQ(events[i].lane, ServerPushLane(rank)) << i;
    EXPECT_EQ(events[i].step, 0) << i;
    EXPECT_EQ(names[i], first_tensors[i % 3]) << i;
    EXPECT_EQ(events[i].bytes, bytes[i % 3]) << i;
    EXPECT_EQ(events[i].start_ns, rank == 1 ? 5000 : 5100) << i;
    EXPECT_EQ(events[i].end_ns, events[i].start_ns) << i;
  }
  EXPECT_EQ(events[6].kind, EventKind::kServerUpdate);
  EXPECT_EQ(events[6].lane, kServerUpdateLane);
  EXPECT_EQ(events[6].step, 0);
  EXPECT_EQ(names[6], "");
  EXPECT_EQ(events[6].bytes, 8 * 4);
  EXPECT_EQ(server.version(), 1);

  // One pull message of two chunks; then the whole model at once.
  std::vector<float> bias(2), tail(2);
  const ParameterServer::ChunkOut outs[] = {{1, 0, absl::MakeSpan(bias)},
                                            {0, 1, absl::MakeSpan(tail)}};
  ASSERT_TRUE(server.PullChunks(1, absl::InfiniteFuture(), outs).ok());
  Params(server);
  events = observer.events();
  names = observer.names();
  ASSERT_EQ(events.size(), 9u);
  EXPECT_EQ(events[7].kind, EventKind::kServerPull);
  EXPECT_EQ(events[7].lane, kServerPullLane);
  EXPECT_EQ(events[7].step, 1);
  EXPECT_EQ(names[7], "fc.bias");
  EXPECT_EQ(events[7].bytes, 16);
  EXPECT_EQ(events[8].kind, EventKind::kServerPull);
  EXPECT_EQ(names[8], "fc.weight");
  EXPECT_EQ(events[8].bytes, 32);
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
  EXPECT_EQ(views->chunks[0].data(), current);  // in place: nobody held it
  EXPECT_EQ(views->chunks[0][0], -1.5f);

  const ParameterServer::ChunkId bad[] = {{1, 1}};
  EXPECT_EQ(server->PullChunkViews(0, absl::InfiniteFuture(), bad).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(server->PullChunkViews(9, absl::Now() + absl::Milliseconds(10), ids).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace ps::server
