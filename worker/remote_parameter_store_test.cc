#include "worker/remote_parameter_store.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/in_process_server.h"
#include "server/parameter_server_testing.h"

namespace ps::worker {
namespace {

using ::testing::HasSubstr;

// Four tensors of 7, 3, 2 and 12 elements in chunks of at most 5: key 0 in
// two chunks (5 + 2), key 3 in three (5 + 5 + 2). Packing fills messages of
// up to 5 elements in order: [a.weight 0], [a.weight 1 + a.bias], [b.bias],
// [b.weight 0], [b.weight 1], [b.weight 2]: 6 messages.
std::vector<ParamSpec> Signature() {
  return {{"a.weight", {7}, DType::kF32},
          {"a.bias", {3}, DType::kF32},
          {"b.bias", {2}, DType::kF32},
          {"b.weight", {3, 4}, DType::kF32}};
}
constexpr int64_t kElements = 24;  // 7 + 3 + 2 + 12
constexpr int64_t kChunkElements = 5;

std::vector<float> Ramp(float start, float step) {
  std::vector<float> v(kElements);
  for (int64_t i = 0; i < kElements; ++i) v[i] = start + step * static_cast<float>(i);
  return v;
}

// A gRPC parameter server for `workers` workers on a free loopback port.
std::unique_ptr<server::InProcessServer> StartServer(int workers) {
  server::ParameterServerOptions options;
  options.num_workers = workers;
  options.chunk_elements = kChunkElements;
  options.optimizer.sgd.lr = 1.f;
  auto server = server::InProcessServer::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
  return std::move(server).value();
}

std::unique_ptr<RemoteParameterStore> MakeStore(const std::string& address,
                                                const std::string& id,
                                                EventObserver* observer = nullptr,
                                                int connections = 1,
                                                const std::string& compression = "none") {
  RemoteStoreOptions options;
  options.server_address = address;
  options.worker_id = id;
  options.identity_proof = id + "'s secret";  // a store made again with the id is its restart
  options.connections = connections;
  options.compression = compression;
  options.rpc_timeout = absl::Seconds(10);
  options.observer = observer;
  auto store = RemoteParameterStore::Create(options);
  EXPECT_TRUE(store.ok()) << store.status();
  return std::move(store).value();
}

class RecordingObserver final : public EventObserver {
 public:
  void OnEvent(const TimedEvent& event) override {
    absl::MutexLock lock(&mu_);
    events_.push_back(event);
    names_.emplace_back(event.name);
  }
  std::vector<TimedEvent> events() {
    absl::MutexLock lock(&mu_);
    return events_;
  }
  std::vector<std::string> names() {
    absl::MutexLock lock(&mu_);
    return names_;
  }

 private:
  absl::Mutex mu_;
  std::vector<TimedEvent> events_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> names_ ABSL_GUARDED_BY(mu_);
};

TEST(RemoteParameterStoreTest, RankZeroSendsItsInitialParametersAndEveryonePullsThem) {
  auto server = StartServer(2);
  auto a = MakeStore(server->address(), "a");
  auto b = MakeStore(server->address(), "b");
  const std::vector<float> proposal = Ramp(1.f, 0.25f);
  auto reg_a = a->Register(Signature(), proposal);
  ASSERT_TRUE(reg_a.ok()) << reg_a.status();
  EXPECT_EQ(reg_a->rank, 0);
  EXPECT_EQ(reg_a->num_workers, 2);
  EXPECT_EQ(reg_a->optimizer, "sgd");
  EXPECT_TRUE(a->sent_initial_parameters());
  // Rank 1's proposal is not asked for: its values never reach the server.
  auto reg_b = b->Register(Signature(), Ramp(-100.f, 1.f));
  ASSERT_TRUE(reg_b.ok()) << reg_b.status();
  EXPECT_EQ(reg_b->rank, 1);
  EXPECT_FALSE(b->sent_initial_parameters());

  for (RemoteParameterStore* store : {a.get(), b.get()}) {
    std::vector<float> params(kElements);
    auto version = store->Pull(0, absl::MakeSpan(params));
    ASSERT_TRUE(version.ok()) << version.status();
    EXPECT_EQ(*version, 0);
    EXPECT_EQ(params, proposal);
  }
}

// A sum-only server (--optimizer=none) says so in every registration, and
// over gRPC serves version 0 as the initial parameters and version 1 as the
// mean of the two workers' gradient sums over their samples.
TEST(RemoteParameterStoreTest, ASumOnlyServerSaysSoAndServesTheMeanGradient) {
  server::ParameterServerOptions options;
  options.num_workers = 2;
  options.chunk_elements = kChunkElements;
  options.optimizer.kind = "none";
  auto server = server::InProcessServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto a = MakeStore((*server)->address(), "a");
  auto b = MakeStore((*server)->address(), "b");
  const std::vector<float> initial = Ramp(1.f, 0.25f);
  for (RemoteParameterStore* store : {a.get(), b.get()}) {
    auto reg = store->Register(Signature(), initial);
    ASSERT_TRUE(reg.ok()) << reg.status();
    EXPECT_EQ(reg->optimizer, "none");
  }
  std::vector<float> version0(kElements);
  ASSERT_TRUE(b->Pull(0, absl::MakeSpan(version0)).ok());
  EXPECT_EQ(version0, initial);
  const std::vector<float> sum_a = Ramp(3.f, -0.5f), sum_b = Ramp(-1.f, 2.f);
  ASSERT_TRUE(a->Push(0, 3, sum_a).ok());
  ASSERT_TRUE(b->Push(0, 5, sum_b).ok());
  std::vector<float> mean(kElements);
  ASSERT_TRUE(a->WaitForVersion(1).ok());
  ASSERT_TRUE(a->Pull(1, absl::MakeSpan(mean)).ok());
  for (int64_t i = 0; i < kElements; ++i) {
    // 8 samples: a power of two, so exactly the weighted mean.
    EXPECT_EQ(mean[i], (sum_a[i] + sum_b[i]) / 8.f) << i;
  }
  // A worker that registers again is told so again, at version 1.
  auto c = MakeStore((*server)->address(), "b");  // b's restart
  auto again = c->Register(Signature(), initial);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->optimizer, "none");
  EXPECT_EQ(again->version, 1);
}

// A server that restarts hands out ranks in arrival order; a worker that
// reconnects asks for the rank it held, so one that held rank 1 and comes
// back first does not become rank 0 (asked for initial parameters it does
// not keep, and moving every sum's rank order).
TEST(RemoteParameterStoreTest, AReconnectAsksForTheRankHeldBefore) {
  auto server = StartServer(2);
  const int port = server->port();
  auto a = MakeStore(server->address(), "a");
  auto b = MakeStore(server->address(), "b");
  ASSERT_EQ(a->Register(Signature(), Ramp(1.f, 0.25f))->rank, 0);
  ASSERT_EQ(b->Register(Signature(), Ramp(1.f, 0.25f))->rank, 1);
  server.reset();
  server::ParameterServerOptions options;
  options.num_workers = 2;
  options.chunk_elements = kChunkElements;
  auto restarted = server::InProcessServer::Start(options, {}, {}, port);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  auto again = b->Reconnect(Signature(), std::vector<float>(kElements, 0.f));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->rank, 1);
  EXPECT_FALSE(b->sent_initial_parameters());
}

TEST(RemoteParameterStoreTest, PushesOfAllWorkersMakeOneUpdateAcrossChunksAndPackedMessages) {
  auto server = StartServer(2);
  RecordingObserver observer;
  auto a = MakeStore(server->address(), "a", &observer);
  auto b = MakeStore(server->address(), "b");
  const std::vector<float> initial = Ramp(1.f, 0.25f);
  ASSERT_TRUE(a->Register(Signature(), initial).ok());
  ASSERT_TRUE(b->Register(Signature(), {}).ok());
  const std::vector<float> grad_a = Ramp(0.5f, 0.125f), grad_b = Ramp(-0.25f, 0.5f);
  ASSERT_TRUE(a->Push(0, 3, grad_a).ok());
  ASSERT_TRUE(b->Push(0, 1, grad_b).ok());
  ASSERT_TRUE(a->WaitForVersion(1).ok());
  std::vector<float> params(kElements);
  auto version = a->Pull(1, absl::MakeSpan(params));
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_EQ(*version, 1);
  for (int64_t i = 0; i < kElements; ++i) {
    // lr 1, the summed gradient over 3 + 1 samples.
    EXPECT_FLOAT_EQ(params[i], initial[i] - (grad_a[i] + grad_b[i]) / 4.f) << i;
  }
  EXPECT_EQ(a->bytes_pushed(), kElements * 4);
  EXPECT_EQ(a->bytes_pulled(), kElements * 4);

  // One event per message (6 each for the initial values, the push and the
  // pull), each on its own stable RPC lane, bytes adding up to the model.
  const std::vector<TimedEvent> events = observer.events();
  const std::vector<std::string> names = observer.names();
  int64_t push_bytes = 0, pull_bytes = 0, pushes = 0, pulls = 0;
  std::vector<int32_t> push_lanes;
  for (size_t i = 0; i < events.size(); ++i) {
    const TimedEvent& e = events[i];
    EXPECT_GE(e.lane, RpcLane(0));
    EXPECT_LT(e.lane, RpcLane(6));
    EXPECT_LE(e.start_ns, e.end_ns);
    if (e.kind == EventKind::kPushMessage && e.step == 0) {
      push_bytes += e.bytes;
      ++pushes;
      push_lanes.push_back(e.lane);
      // Lane 1 carries a.weight's chunk 1, then a.bias.
      if (e.lane == RpcLane(0) || e.lane == RpcLane(1)) {
        EXPECT_EQ(names[i], "a.weight");
      }
      if (e.lane == RpcLane(2)) {
        EXPECT_EQ(names[i], "b.bias");
      }
    }
    if (e.kind == EventKind::kPullMessage) {
      pull_bytes += e.bytes;
      ++pulls;
      EXPECT_EQ(e.step, 0);  // the pull of version 1 ends iteration 0
    }
  }
  EXPECT_EQ(pushes, 6);
  EXPECT_EQ(pulls, 6);
  EXPECT_EQ(push_bytes, kElements * 4);
  EXPECT_EQ(pull_bytes, kElements * 4);
  std::sort(push_lanes.begin(), push_lanes.end());
  EXPECT_EQ(std::unique(push_lanes.begin(), push_lanes.end()), push_lanes.end());
}

// Messages spread over several connections per direction, segment calls in
// flight together: the same update as the blocking calls over one.
TEST(RemoteParameterStoreTest, SegmentsOverSeveralConnectionsMakeTheSameUpdate) {
  auto server = StartServer(2);
  auto a = MakeStore(server->address(), "a", nullptr, /*connections=*/3);
  auto b = MakeStore(server->address(), "b", nullptr, /*connections=*/2);
  const std::vector<float> initial = Ramp(1.f, 0.25f);
  ASSERT_TRUE(a->Register(Signature(), initial).ok());
  ASSERT_TRUE(b->Register(Signature(), {}).ok());
  EXPECT_EQ(a->SegmentEnds(), (std::vector<int64_t>{5, 10, 12, 17, 22, 24}));
  const std::vector<float> grad_a = Ramp(0.5f, 0.125f), grad_b = Ramp(-0.25f, 0.5f);
  std::vector<float> params_a(kElements), params_b(kElements);
  absl::Mutex mu;
  int pending = 0;
  absl::Status first_error;
  auto done = [&](absl::Status s) {
    absl::MutexLock lock(&mu);
    if (!s.ok() && first_error.ok()) first_error = s;
    --pending;
  };
  auto wait_all = [&] {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(+[](int* n) { return *n == 0; }, &pending));
    return first_error;
  };
  // Both workers' pushes of every segment in flight at once, back to front,
  // then every pull (held by the server until both pushes are in).
  pending = 12;
  for (int seg = 6; seg-- > 0;) {
    a->PushSegments(0, 3, seg, seg + 1, grad_a, done);
    b->PushSegments(0, 1, seg, seg + 1, grad_b, done);
  }
  ASSERT_TRUE(wait_all().ok()) << first_error;
  pending = 2;
  a->PullSegments(1, 0, 6, absl::MakeSpan(params_a), done);
  b->PullSegments(1, 0, 6, absl::MakeSpan(params_b), done);
  ASSERT_TRUE(wait_all().ok()) << first_error;
  for (int64_t i = 0; i < kElements; ++i) {
    EXPECT_FLOAT_EQ(params_a[i], initial[i] - (grad_a[i] + grad_b[i]) / 4.f) << i;
  }
  EXPECT_EQ(params_a, params_b);
  // No connections is refused.
  RemoteStoreOptions bad;
  bad.server_address = server->address();
  bad.connections = 0;
  EXPECT_EQ(RemoteParameterStore::Create(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

// Shared memory on one host: worker a's bytes go through it both ways,
// worker b's by TCP, and the updates are the same as all-TCP, step after
// step (the pull area is rewritten each time).
TEST(RemoteParameterStoreTest, SharedMemoryMakesTheSameUpdatesAsTcp) {
  auto server = StartServer(2);
  RemoteStoreOptions options;
  options.server_address = server->address();
  options.worker_id = "a";
  options.shared_memory = true;
  options.rpc_timeout = absl::Seconds(10);
  auto a = RemoteParameterStore::Create(options);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = MakeStore(server->address(), "b");
  std::vector<float> expected = Ramp(1.f, 0.25f);
  ASSERT_TRUE((*a)->Register(Signature(), expected).ok());
  ASSERT_TRUE(b->Register(Signature(), {}).ok());
  EXPECT_TRUE((*a)->uses_shared_memory());
  EXPECT_FALSE(b->uses_shared_memory());
  for (int64_t step = 0; step < 3; ++step) {
    const std::vector<float> grad_a = Ramp(0.5f + step, 0.125f), grad_b = Ramp(-0.25f, 0.5f);
    ASSERT_TRUE((*a)->Push(step, 3, grad_a).ok());
    ASSERT_TRUE(b->Push(step, 1, grad_b).ok());
    std::vector<float> params_a(kElements), params_b(kElements);
    ASSERT_TRUE((*a)->Pull(step + 1, absl::MakeSpan(params_a)).ok());
    ASSERT_TRUE(b->Pull(step + 1, absl::MakeSpan(params_b)).ok());
    for (int64_t i = 0; i < kElements; ++i) {
      expected[i] -= (grad_a[i] + grad_b[i]) / 4.f;
      EXPECT_FLOAT_EQ(params_a[i], expected[i]) << "step " << step << " element " << i;
    }
    EXPECT_EQ(params_a, params_b) << "step " << step;
  }
  // Compressed wires stay on TCP: nothing is offered.
  auto server1 = StartServer(1);
  options.server_address = server1->address();
  options.worker_id = "c";
  options.compression = "fp16";
  auto c = RemoteParameterStore::Create(options);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE((*c)->Register(Signature(), Ramp(1.f, 0.25f)).ok());
  EXPECT_FALSE((*c)->uses_shared_memory());
}

// One message of a batch refused, the others answered on a connection of
// their own that writes nothing more: the batch's `done` comes with the
// refusal without waiting for gRPC to drop the answered messages' slices
// (it keeps a written message's slices until that connection's next write).
TEST(RemoteParameterStoreTest, ABatchWithOneRefusedMessageEndsWithoutAnotherWrite) {
  auto server = StartServer(1);
  auto store = MakeStore(server->address(), "a", nullptr, /*connections=*/2);
  ASSERT_TRUE(store->Register(Signature(), Ramp(1.f, 0.25f)).ok());
  std::vector<float> gradient = Ramp(0.5f, 0.125f);
  gradient[0] = std::numeric_limits<float>::quiet_NaN();  // message 0, connection 0
  absl::Notification finished;
  absl::Status result;
  store->PushSegments(0, 1, 0, 6, gradient, [&](absl::Status s) {
    result = s;
    finished.Notify();
  });
  ASSERT_TRUE(finished.WaitForNotificationWithTimeout(absl::Seconds(20)))
      << "the batch never ended";
  EXPECT_EQ(result.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(result.message()), HasSubstr("refusing a non-finite value"));
}

TEST(RemoteParameterStoreTest, ErrorsNameTheCallAndTheMessage) {
  auto server = StartServer(1);
  auto store = MakeStore(server->address(), "a");
  std::vector<float> params(kElements);
  EXPECT_EQ(store->Push(0, 1, Ramp(0, 1)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store->Pull(0, absl::MakeSpan(params)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // A proposal of the wrong size when the server asks for one.
  auto short_proposal = store->Register(Signature(), std::vector<float>(3, 1.f));
  EXPECT_EQ(short_proposal.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(short_proposal.status().message()), HasSubstr("proposed 3 elements"));

  auto reg = store->Register(Signature(), Ramp(0, 1));
  ASSERT_TRUE(reg.ok()) << reg.status();
  EXPECT_EQ(store->Push(0, 1, std::vector<float>(5)).code(), absl::StatusCode::kInvalidArgument);
  // The server refuses a push for the wrong iteration; the error names the
  // call and its message's first chunk.
  const absl::Status stale = store->Push(4, 1, Ramp(0, 1));
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(stale.message()), HasSubstr("Push of key "));
  EXPECT_THAT(std::string(stale.message()), HasSubstr("iteration 4 but the server is at iteration 0"));
  // A non-finite gradient is refused and changes nothing.
  std::vector<float> bad = Ramp(0, 1);
  bad[20] = NAN;
  EXPECT_EQ(store->Push(0, 1, bad).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(server->domain().version(), 0);
}

TEST(RemoteParameterStoreTest, NoServerIsAnErrorAfterTheConnectTimeout) {
  RemoteStoreOptions options;
  options.server_address = "127.0.0.1:1";  // nothing listens on port 1
  options.worker_id = "lonely";
  options.connect_timeout = absl::Milliseconds(300);
  auto store = RemoteParameterStore::Create(options);
  ASSERT_TRUE(store.ok());
  auto reg = (*store)->Register(Signature(), Ramp(0, 1));
  EXPECT_FALSE(reg.ok());
  EXPECT_THAT(std::string(reg.status().message()), HasSubstr("Register with 127.0.0.1:1"));
  EXPECT_EQ(RemoteParameterStore::Create(RemoteStoreOptions{.server_address = ""}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A log that a test reads while the store writes it.
class Lines {
 public:
  std::function<void(const std::string&)> Sink() {
    return [this](const std::string& line) {
      absl::MutexLock lock(&mu_);
      lines_.push_back(line);
    };
  }
  std::vector<std::string> get() const {
    absl::MutexLock lock(&mu_);
    return lines_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
};

// Register's back-off and connect timeout run on the store's clock: with
// nothing listening, attempts at 0, 100, 300 and 700 ms (back-off 100 ms
// doubling), each failure logged, and a last one at the 1 s timeout, which
// gives up. Each WaitForWaiters returns once the registering thread sleeps
// on the clock again, having done all it does at that reading.
TEST(RemoteParameterStoreTest, RegisterRetriesOnItsClockAndGivesUpExactlyAtTheTimeout) {
  FakeClock clock;
  Lines log;
  RemoteStoreOptions options;
  options.server_address = "127.0.0.1:1";  // nothing listens on port 1
  options.worker_id = "lonely";
  options.connect_timeout = absl::Seconds(1);
  options.clock = &clock;
  options.log = log.Sink();
  auto store = RemoteParameterStore::Create(options);
  ASSERT_TRUE(store.ok()) << store.status();
  absl::StatusOr<ParameterStore::Registration> registration;
  std::thread registrar([&] { registration = (*store)->Register(Signature(), Ramp(0, 1)); });
  auto attempts_logged_at = [&](absl::Duration step) {
    clock.Advance(step);
    EXPECT_TRUE(clock.WaitForWaiters(1));
    return log.get().size();
  };
  EXPECT_EQ(attempts_logged_at(absl::ZeroDuration()), 1u);
  EXPECT_EQ(attempts_logged_at(absl::Milliseconds(99)), 1u);   // 99 ms
  EXPECT_EQ(attempts_logged_at(absl::Milliseconds(1)), 2u);    // 100 ms
  EXPECT_EQ(attempts_logged_at(absl::Milliseconds(199)), 2u);  // 299 ms
  EXPECT_EQ(attempts_logged_at(absl::Milliseconds(1)), 3u);    // 300 ms
  EXPECT_EQ(attempts_logged_at(absl::Milliseconds(400)), 4u);  // 700 ms
  EXPECT_EQ(attempts_logged_at(absl::Milliseconds(299)), 4u);  // 999 ms
  clock.Advance(absl::Milliseconds(1));                        // 1 s: the last attempt
  registrar.join();
  EXPECT_EQ(registration.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(registration.status().message()),
              HasSubstr("did not answer within 1s (5 attempts"));
  const std::vector<std::string> lines = log.get();
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_THAT(lines[1], HasSubstr("(100ms, attempt 2)"));
  EXPECT_THAT(lines[3], HasSubstr("(700ms, attempt 4)"));
}

// Token only: a second process naming a live worker's id without its
// secret waits (logging why) until the server, on the same fake clock,
// declares the holder lost; with the secret it takes the rank at once.
TEST(RemoteParameterStoreTest, ALiveIdWaitsForTheLivenessBoundUnlessItProvesItself) {
  FakeClock clock(absl::ToInt64Nanoseconds(absl::Seconds(100)));
  server::ParameterServerOptions server_options;
  server_options.num_workers = 1;
  server_options.chunk_elements = kChunkElements;
  server_options.clock = &clock;
  auto server = server::InProcessServer::Start(server_options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto store = [&](const std::string& proof, Lines* log) {
    RemoteStoreOptions options;
    options.server_address = (*server)->address();
    options.worker_id = "w0";
    options.identity_proof = proof;
    options.heartbeat_interval = absl::ZeroDuration();  // heard only when it registers
    options.clock = &clock;
    if (log != nullptr) options.log = log->Sink();
    auto created = RemoteParameterStore::Create(options);
    EXPECT_TRUE(created.ok()) << created.status();
    return std::move(created).value();
  };
  auto first = store("w0's secret", nullptr);
  ASSERT_TRUE(first->Register(Signature(), Ramp(0, 1)).ok());
  // The same worker restarted, with its secret: at once.
  auto restarted = store("w0's secret", nullptr);
  auto again = restarted->Register(Signature(), Ramp(0, 1));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->rank, 0);
  // Without it (a store makes a secret of its own): refused while live,
  // and waiting for the bound (10 s).
  Lines log;
  auto stranger = store("", &log);
  absl::StatusOr<ParameterStore::Registration> taken;
  std::thread registrar([&] { taken = stranger->Register(Signature(), Ramp(0, 1)); });
  ASSERT_TRUE(clock.WaitForWaiters(1));
  clock.Advance(absl::Seconds(5));
  ASSERT_TRUE(clock.WaitForWaiters(1));
  std::vector<std::string> lines = log.get();
  ASSERT_GE(lines.size(), 1u);
  EXPECT_THAT(lines[0], HasSubstr("to declare worker id 'w0''s holder lost"));
  EXPECT_THAT(lines[0], HasSubstr("worker 'w0' is live: rank 0's holder was heard 0.0 s ago"));
  clock.Advance(absl::Seconds(6));  // 11 s since it was heard: lost
  registrar.join();
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(taken->rank, 0);
}

// A heartbeat every heartbeat_interval of the store's clock, exactly then.
TEST(RemoteParameterStoreTest, HeartbeatsGoEveryIntervalOfTheClock) {
  auto server = StartServer(1);
  FakeClock clock;
  absl::Mutex mu;
  int heartbeats = 0;
  RemoteStoreOptions options;
  options.server_address = server->address();
  options.worker_id = "a";
  options.heartbeat_interval = absl::Seconds(2);
  options.clock = &clock;
  options.report = [&](proto::HeartbeatRequest*) {
    absl::MutexLock lock(&mu);
    ++heartbeats;
  };
  auto store = RemoteParameterStore::Create(options);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Register(Signature(), Ramp(0, 1)).ok());
  auto heartbeats_at = [&](absl::Duration step) {
    clock.Advance(step);
    EXPECT_TRUE(clock.WaitForWaiters(1));  // the heartbeat thread asleep again
    absl::MutexLock lock(&mu);
    return heartbeats;
  };
  EXPECT_EQ(heartbeats_at(absl::ZeroDuration()), 0);
  EXPECT_EQ(heartbeats_at(absl::Seconds(2) - absl::Nanoseconds(1)), 0);
  EXPECT_EQ(heartbeats_at(absl::Nanoseconds(1)), 1);  // 2 s
  EXPECT_EQ(heartbeats_at(absl::Seconds(1)), 1);      // 3 s
  EXPECT_EQ(heartbeats_at(absl::Seconds(1)), 2);      // 4 s
  store->reset();  // wakes the heartbeat thread at once, without the clock
  EXPECT_EQ(clock.waiters(), 0);
}

}  // namespace
}  // namespace ps::worker

namespace ps::worker {
namespace {

// --compression: the gradient travels as fp16 or bf16 (half the bytes),
// the server decodes it into fp32, sums and updates its fp32 master
// weights, and pulls come back in the same encoding: the worker sees the
// server's parameters rounded to it.
TEST(RemoteParameterStoreCompressionTest, HalfPrecisionOnTheWireBothWays) {
  for (const char* compression : {"fp16", "bf16"}) {
    SCOPED_TRACE(compression);
    auto server = StartServer(1);
    auto store = MakeStore(server->address(), "w", nullptr, 1, compression);
    const std::vector<float> initial = Ramp(0.5f, 0.25f);
    auto reg = store->Register(Signature(), initial);
    ASSERT_TRUE(reg.ok()) << reg.status();
    std::vector<float> params(kElements);
    // The initial values travel exactly (fp32); pulls in the codec's dtype.
    ASSERT_TRUE(store->Pull(0, absl::MakeSpan(params)).ok());
    auto codec = MakeWireCodec(compression);
    ASSERT_TRUE(codec.ok());
    auto rounded = [&](std::vector<float> v) {
      std::string bytes((*codec)->EncodedBytes(kElements), '\0');
      (*codec)->Encode(v, bytes.data());
      const absl::string_view piece(bytes);
      EXPECT_TRUE((*codec)->Decode(absl::MakeConstSpan(&piece, 1), absl::MakeSpan(v)).ok());
      return v;
    };
    EXPECT_EQ(params, rounded(initial));
    // lr 1, one sample: the server's fp32 parameters drop by the decoded
    // gradient.
    const std::vector<float> gradient = Ramp(0.1f, 0.013f);
    ASSERT_TRUE(store->Push(0, 1, gradient).ok());
    ASSERT_TRUE(store->Pull(1, absl::MakeSpan(params)).ok());
    const std::vector<float> sent = rounded(gradient);
    std::vector<float> master(kElements);
    ASSERT_TRUE(Pull(server->domain(), 1, absl::InfiniteFuture(), absl::MakeSpan(master)).ok());
    for (int64_t i = 0; i < kElements; ++i) {
      EXPECT_EQ(master[i], initial[i] - sent[i]) << i;  // fp32 on the server
    }
    EXPECT_EQ(params, rounded(master));
    EXPECT_EQ(store->bytes_pushed(), 2 * kElements);
    EXPECT_EQ(store->bytes_pulled(), 2 * 2 * kElements);
  }
}

// Under dynamic loss scaling an overflowing step's push is all NaN, which
// top-k pairs cannot carry: the combination is refused at registration,
// naming both, rather than failing at the first overflow.
TEST(RemoteParameterStoreCompressionTest, TopKWithDynamicLossScalingIsRefusedAtRegistration) {
  server::ParameterServerOptions options;
  options.num_workers = 1;
  options.chunk_elements = kChunkElements;
  options.loss_scale.dynamic = true;
  auto server = server::InProcessServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto store = MakeStore((*server)->address(), "w", nullptr, 1, "topk:0.2");
  const auto refused = store->Register(Signature(), Ramp(1.f, 0.25f));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("--loss_scale=dynamic"));
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("--compression=topk"));
  auto fp16 = MakeStore((*server)->address(), "w", nullptr, 1, "fp16");
  EXPECT_TRUE(fp16->Register(Signature(), Ramp(1.f, 0.25f)).ok());
}

TEST(RemoteParameterStoreCompressionTest, AnUnknownCompressionIsRefusedAtCreate) {
  RemoteStoreOptions options;
  options.compression = "fp8";
  EXPECT_EQ(RemoteParameterStore::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ps::worker

namespace ps::worker {
namespace {

// topk:F through the real service: each push sends the largest values of
// each chunk and keeps the rest for later steps (error feedback), so over
// steps the server receives all of the gradient; pulls are fp32; the bytes
// pushed are 8 per value sent.
TEST(RemoteParameterStoreCompressionTest, TopKWithErrorFeedbackDeliversEverythingEventually) {
  auto server = StartServer(1);
  // topk:0.2: one value of each chunk of up to 5.
  auto store = MakeStore(server->address(), "w", nullptr, 1, "topk:0.2");
  const std::vector<float> initial(kElements, 0.f);
  ASSERT_TRUE(store->Register(Signature(), initial).ok());
  // The same gradient every step; with lr 1 and one sample each step the
  // server's parameters drop by what arrived. After as many steps as the
  // largest chunk has elements (5), every value has been sent at least once
  // and the sum of what arrived plus what is held back is the sum pushed.
  const std::vector<float> gradient = Ramp(1.f, 0.5f);
  constexpr int kSteps = 5;
  for (int step = 0; step < kSteps; ++step) {
    ASSERT_TRUE(store->Push(step, 1, gradient).ok()) << step;
  }
  // Then zeros: what was held back goes out, one value per chunk per step,
  // within as many steps as the longest chunk (5) has values.
  const std::vector<float> zeros(kElements, 0.f);
  for (int step = kSteps; step < 2 * kSteps; ++step) {
    ASSERT_TRUE(store->Push(step, 1, zeros).ok()) << step;
  }
  std::vector<float> params(kElements);
  ASSERT_TRUE(store->Pull(2 * kSteps, absl::MakeSpan(params)).ok());
  // Nothing lost: the parameters fell by all that was pushed (halves, so
  // every sum is exact whatever order the values went in).
  for (int64_t i = 0; i < kElements; ++i) EXPECT_EQ(params[i], -kSteps * gradient[i]) << i;
  // 7 chunks (5 + 2, 3, 2, 5 + 5 + 2): 7 values sent per step, 8 bytes each;
  // one fp32 pull.
  EXPECT_EQ(store->bytes_pushed(), 2 * kSteps * 7 * 8);
  EXPECT_EQ(store->bytes_pulled(), 4 * kElements);
}

// Under topk, a pull of version v into the buffer that holds v - 1 brings
// only the elements that changed (plain SGD changes only those some worker
// sent): the same parameters as a full pull, bit for bit, for a fraction of
// the bytes; a pull into another buffer is dense again.
TEST(RemoteParameterStoreCompressionTest, TopKPullsOnlyWhatChanged) {
  auto server = StartServer(1);
  // topk:0.2: one value of each of the 7 chunks.
  auto store = MakeStore(server->address(), "w", nullptr, 1, "topk:0.2");
  const std::vector<float> initial = Ramp(10.f, 1.f);
  ASSERT_TRUE(store->Register(Signature(), initial).ok());
  const int segments = static_cast<int>(store->SegmentEnds().size());
  auto pull = [&](int64_t version, std::vector<float>& into) {
    absl::Notification done;
    absl::Status status;
    store->PullSegments(version, 0, segments, absl::MakeSpan(into), [&](absl::Status s) {
      status = s;
      done.Notify();
    });
    done.WaitForNotification();
    return status;
  };
  std::vector<float> params(kElements);
  ASSERT_TRUE(pull(0, params).ok());
  EXPECT_EQ(params, initial);
  int64_t pulled = store->bytes_pulled();
  EXPECT_EQ(pulled, 4 * kElements);  // nothing held yet: dense
  const std::vector<float> gradient = Ramp(1.f, 0.5f);
  for (int64_t step = 0; step < 3; ++step) {
    ASSERT_TRUE(store->Push(step, 1, gradient).ok());
    ASSERT_TRUE(pull(step + 1, params).ok());
    // 7 values changed (one per chunk): 7 pairs of 8 bytes.
    EXPECT_EQ(store->bytes_pulled() - pulled, 7 * 8) << "step " << step;
    pulled = store->bytes_pulled();
    std::vector<float> full(kElements);
    ASSERT_TRUE(Pull(server->domain(), step + 1, absl::InfiniteFuture(), absl::MakeSpan(full)).ok());
    EXPECT_EQ(0, std::memcmp(params.data(), full.data(), sizeof(float) * kElements))
        << "step " << step;
  }
  // Another buffer: dense.
  std::vector<float> other(kElements);
  ASSERT_TRUE(pull(3, other).ok());
  EXPECT_EQ(store->bytes_pulled() - pulled, 4 * kElements);
  EXPECT_EQ(other, params);
}

}  // namespace
}  // namespace ps::worker
