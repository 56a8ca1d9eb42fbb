// The C ABI end to end against real gRPC servers in this process: what a
// ctypes caller sees, call by call.

#include "worker/client/ps_client.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/consistency/consistency.h"
#include "server/in_process_server.h"

namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Four tensors of 7, 3, 2 and 12 elements in server chunks of at most 5:
// six messages, so six segments per server.
struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
  int32_t dtype = PS_DTYPE_F32;
};
std::vector<Tensor> Model() {
  return {{"a.weight", {7}}, {"a.bias", {3}}, {"b.bias", {2}}, {"b.weight", {3, 4}}};
}
constexpr int64_t kElements = 24;
constexpr int64_t kChunkElements = 5;

std::vector<ps_tensor_spec> Specs(const std::vector<Tensor>& tensors) {
  std::vector<ps_tensor_spec> specs;
  for (const Tensor& t : tensors) {
    specs.push_back(
        {t.name.c_str(), t.shape.data(), static_cast<int32_t>(t.shape.size()), t.dtype});
  }
  return specs;
}

std::vector<float> Ramp(float start, float step) {
  std::vector<float> v(kElements);
  for (int64_t i = 0; i < kElements; ++i) v[i] = start + step * static_cast<float>(i);
  return v;
}

std::unique_ptr<ps::server::InProcessServer> StartServer(
    int workers,
    std::shared_ptr<const ps::server::Consistency> consistency = ps::server::SyncConsistency()) {
  ps::server::ParameterServerOptions options;
  options.num_workers = workers;
  options.chunk_elements = kChunkElements;
  options.optimizer.sgd.lr = 1.f;
  options.consistency = std::move(consistency);
  auto server = ps::server::InProcessServer::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
  return std::move(server).value();
}

struct ClientCloser {
  void operator()(ps_client* c) const { ps_client_close(c); }
};
struct HandleFreer {
  void operator()(ps_handle* h) const { ps_handle_free(h); }
};
using ClientPtr = std::unique_ptr<ps_client, ClientCloser>;
using HandlePtr = std::unique_ptr<ps_handle, HandleFreer>;

ps_options Options(const std::string& servers, const std::string& worker_id) {
  ps_options options;
  ps_error error;
  EXPECT_EQ(ps_options_init(&options, PS_CLIENT_ABI_VERSION, &error), PS_OK) << error.message;
  // The strings live in static storage of the test: connect copies them.
  static absl::Mutex mu;
  static auto* kept = new std::vector<std::unique_ptr<std::string>>();
  absl::MutexLock lock(&mu);
  kept->push_back(std::make_unique<std::string>(servers));
  options.servers = kept->back()->c_str();
  kept->push_back(std::make_unique<std::string>(worker_id));
  options.worker_id = kept->back()->c_str();
  options.rpc_timeout_ms = 10000;
  options.wait_timeout_ms = 20000;
  options.connect_timeout_ms = 10000;
  return options;
}

ClientPtr Connect(const ps_options& options) {
  ps_client* client = nullptr;
  ps_error error;
  EXPECT_EQ(ps_client_connect(&options, &client, &error), PS_OK) << error.message;
  return ClientPtr(client);
}

ClientPtr Connect(const std::string& servers, const std::string& worker_id) {
  return Connect(Options(servers, worker_id));
}

ps_registration Register(ps_client* client, const std::vector<float>& initial) {
  const std::vector<Tensor> model = Model();
  const std::vector<ps_tensor_spec> specs = Specs(model);
  ps_registration registration;
  ps_error error;
  EXPECT_EQ(ps_client_register(client, specs.data(), specs.size(), initial.data(), initial.size(),
                               0, &registration, &error),
            PS_OK)
      << error.message;
  return registration;
}

HandlePtr Push(ps_client* client, int64_t iteration, int64_t samples, int first, int last,
               const std::vector<float>& gradient) {
  ps_handle* handle = nullptr;
  ps_error error;
  EXPECT_EQ(ps_client_push(client, iteration, samples, first, last, gradient.data(),
                           gradient.size(), &handle, &error),
            PS_OK)
      << error.message;
  return HandlePtr(handle);
}

// The gradient is read until the push is done: never a temporary.
HandlePtr Push(ps_client* client, int64_t iteration, int64_t samples, int first, int last,
               std::vector<float>&& gradient) = delete;

HandlePtr Pull(ps_client* client, int64_t version, int first, int last,
               std::vector<float>& params) {
  ps_handle* handle = nullptr;
  ps_error error;
  EXPECT_EQ(
      ps_client_pull(client, version, first, last, params.data(), params.size(), &handle, &error),
      PS_OK)
      << error.message;
  return HandlePtr(handle);
}

// Waits (20 s at most) and returns the handle's status, its message in `error`.
ps_status Wait(ps_handle* handle, ps_error* error) {
  int32_t done = 0;
  const ps_status status = ps_handle_wait(handle, 20000, &done, error);
  EXPECT_EQ(done, 1) << "the operation did not finish in 20 s";
  return status;
}

int64_t Segments(ps_client* client) {
  int64_t count = -1;
  ps_error error;
  EXPECT_EQ(ps_client_segment_ends(client, nullptr, 0, &count, &error), PS_OK) << error.message;
  return count;
}

// Each of `clients` pushes its gradient (from `gradients`, over `samples`)
// for iteration 0 in two halves and pulls version 1 segment by segment;
// every client must end with initial - (sum of gradients) / (sum of samples)
// (lr 1, plain SGD).
void ExpectOneSyncStep(const std::vector<ps_client*>& clients, const std::vector<float>& initial,
                       const std::vector<std::vector<float>>& gradients,
                       const std::vector<int64_t>& samples) {
  std::vector<std::vector<float>> params(clients.size(), std::vector<float>(kElements, -1.f));
  std::vector<HandlePtr> handles;
  for (size_t c = 0; c < clients.size(); ++c) {
    const int segments = static_cast<int>(Segments(clients[c]));
    ASSERT_GT(segments, 2);
    handles.push_back(Push(clients[c], 0, samples[c], segments / 2, segments, gradients[c]));
    handles.push_back(Push(clients[c], 0, samples[c], 0, segments / 2, gradients[c]));
    for (int s = 0; s < segments; ++s) handles.push_back(Pull(clients[c], 1, s, s + 1, params[c]));
  }
  for (HandlePtr& h : handles) {
    ps_error error;
    ASSERT_EQ(Wait(h.get(), &error), PS_OK) << error.message;
  }
  int64_t total = 0;
  for (int64_t n : samples) total += n;
  for (size_t c = 0; c < clients.size(); ++c) {
    for (int64_t i = 0; i < kElements; ++i) {
      float sum = 0;
      for (const auto& g : gradients) sum += g[i];
      EXPECT_FLOAT_EQ(params[c][i], initial[i] - sum / static_cast<float>(total))
          << "client " << c << " element " << i;
    }
  }
}

TEST(PsClientTest, AbiVersionAndStatusNames) {
  EXPECT_EQ(ps_client_abi_version(), PS_CLIENT_ABI_VERSION);
  EXPECT_STREQ(ps_status_name(PS_OK), "OK");
  EXPECT_STREQ(ps_status_name(PS_FAILED_PRECONDITION), "FAILED_PRECONDITION");
  EXPECT_STREQ(ps_status_name(PS_UNAUTHENTICATED), "UNAUTHENTICATED");
  EXPECT_STREQ(ps_status_name(17), "UNKNOWN_CODE");
  EXPECT_STREQ(ps_status_name(-1), "UNKNOWN_CODE");
}

TEST(PsClientTest, TwoClientsSumTheirGradientsInSync) {
  auto server = StartServer(2);
  ClientPtr a = Connect(server->address(), "a");
  ClientPtr b = Connect(server->address(), "b");
  const std::vector<float> initial = Ramp(1.f, 0.25f);
  const ps_registration ra = Register(a.get(), initial);
  // Rank 1's values are not asked for.
  const ps_registration rb = Register(b.get(), Ramp(-100.f, 1.f));
  EXPECT_EQ(ra.rank, 0);
  EXPECT_EQ(rb.rank, 1);
  EXPECT_EQ(ra.num_workers, 2);
  EXPECT_EQ(ra.version, 0);
  EXPECT_STREQ(ra.consistency, "sync");
  EXPECT_STREQ(ra.optimizer, "sgd");
  EXPECT_EQ(ra.exact_pulls, 1);
  EXPECT_EQ(ra.independent_steps, 0);
  EXPECT_EQ(ra.loss_scale, 0.f);
  EXPECT_EQ(ra.num_segments, 6);
  EXPECT_EQ(ra.num_elements, kElements);

  // Version 0 is rank 0's proposal, for both.
  for (ps_client* c : {a.get(), b.get()}) {
    std::vector<float> params(kElements);
    int64_t pulled = -1;
    ps_error error;
    ASSERT_EQ(ps_client_pull_all(c, 0, params.data(), params.size(), &pulled, &error), PS_OK)
        << error.message;
    EXPECT_EQ(pulled, 0);
    EXPECT_EQ(params, initial);
  }
  std::vector<int64_t> ends(6);
  int64_t count = 0;
  ps_error error;
  ASSERT_EQ(ps_client_segment_ends(a.get(), ends.data(), ends.size(), &count, &error), PS_OK);
  EXPECT_EQ(count, 6);
  EXPECT_THAT(ends, ElementsAre(5, 10, 12, 17, 22, 24));
  std::vector<int32_t> ranks(2);
  int32_t members = 0;
  ASSERT_EQ(ps_client_members(a.get(), 0, ranks.data(), 2, &members, &error), PS_OK)
      << error.message;
  EXPECT_EQ(members, 2);
  EXPECT_THAT(ranks, ElementsAre(0, 1));

  ExpectOneSyncStep({a.get(), b.get()}, initial, {Ramp(0.5f, 0.125f), Ramp(-0.25f, 0.5f)}, {3, 1});
  ASSERT_EQ(ps_client_wait_for_version(b.get(), 1, &error), PS_OK) << error.message;
  float scale = -1;
  ASSERT_EQ(ps_client_loss_scale(a.get(), &scale, &error), PS_OK);
  EXPECT_EQ(scale, 0.f);
}

// A client restarted with its identity file takes its rank back at once
// (its id is live on the server); the file is made at the first connect.
TEST(PsClientTest, ARestartWithTheIdentityFileTakesItsRankBack) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir != nullptr ? dir : "/tmp") + "/a.identity";
  std::remove(path.c_str());
  auto server = StartServer(1);
  ps_options options = Options(server->address(), "a");
  options.identity_file = path.c_str();
  ClientPtr first = Connect(options);
  EXPECT_EQ(Register(first.get(), Ramp(0, 1)).rank, 0);
  ClientPtr restarted = Connect(options);
  EXPECT_EQ(Register(restarted.get(), Ramp(0, 1)).rank, 0);
}

TEST(PsClientTest, ShardedOverTwoServers) {
  auto first = StartServer(2);
  auto second = StartServer(2);
  const std::string servers = absl::StrCat(first->address(), ",", second->address());
  ClientPtr a = Connect(servers, "a");
  ClientPtr b = Connect(servers, "b");
  const std::vector<float> initial = Ramp(2.f, -0.5f);
  const ps_registration ra = Register(a.get(), initial);
  Register(b.get(), {});
  // Each shard cuts its half into messages of its own: 12 elements in
  // chunks of 5 is three.
  EXPECT_EQ(ra.num_segments, 6);
  EXPECT_EQ(ra.num_elements, kElements);
  ExpectOneSyncStep({a.get(), b.get()}, initial, {Ramp(1.f, 0.5f), Ramp(0.f, -0.25f)}, {2, 2});
  // Both servers hold half of the model each.
  EXPECT_GT(first->domain().version(), 0);
  EXPECT_GT(second->domain().version(), 0);
}

TEST(PsClientTest, AsyncAndSspSettingsAreRead) {
  auto async = StartServer(1, ps::server::AsyncConsistency());
  ClientPtr a = Connect(async->address(), "a");
  const ps_registration ra = Register(a.get(), Ramp(0, 1));
  EXPECT_STREQ(ra.consistency, "async");
  EXPECT_EQ(ra.independent_steps, 1);
  EXPECT_EQ(ra.exact_pulls, 0);
  EXPECT_EQ(ra.staleness_bound, 0);

  auto ssp = StartServer(1, ps::server::SspConsistency(2).value());
  ClientPtr b = Connect(ssp->address(), "b");
  Register(b.get(), Ramp(0, 1));
  ps_registration rb;
  ps_error error;
  ASSERT_EQ(ps_client_registration(b.get(), &rb, &error), PS_OK) << error.message;
  EXPECT_STREQ(rb.consistency, "ssp:2");
  EXPECT_EQ(rb.staleness_bound, 2);
  EXPECT_EQ(rb.independent_steps, 0);
  EXPECT_EQ(rb.exact_pulls, 0);
}

TEST(PsClientTest, ASumOnlyServerSaysSoAndServesTheMeanGradient) {
  ps::server::ParameterServerOptions options;
  options.num_workers = 2;
  options.chunk_elements = kChunkElements;
  options.optimizer.kind = "none";  // --optimizer=none
  auto server = ps::server::InProcessServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  ClientPtr a = Connect((*server)->address(), "a");
  ClientPtr b = Connect((*server)->address(), "b");
  const std::vector<float> initial = Ramp(3.f, 1.f);
  const ps_registration ra = Register(a.get(), initial);
  Register(b.get(), {});
  EXPECT_STREQ(ra.optimizer, "none");
  // Version 1 is the mean over the global batch of the pushed gradient
  // sums, whatever the parameters were.
  const std::vector<float> ga = Ramp(1.f, 0.5f), gb = Ramp(0.f, -0.25f);
  std::vector<float> pa(kElements, -1.f), pb(kElements, -1.f);
  const int segments = static_cast<int>(Segments(a.get()));
  std::vector<HandlePtr> handles;
  handles.push_back(Push(a.get(), 0, 1, 0, segments, ga));
  handles.push_back(Push(b.get(), 0, 3, 0, segments, gb));
  handles.push_back(Pull(a.get(), 1, 0, segments, pa));
  handles.push_back(Pull(b.get(), 1, 0, segments, pb));
  for (HandlePtr& h : handles) {
    ps_error error;
    ASSERT_EQ(Wait(h.get(), &error), PS_OK) << error.message;
  }
  for (int64_t i = 0; i < kElements; ++i) {
    EXPECT_FLOAT_EQ(pa[i], (ga[i] + gb[i]) / 4.f) << "element " << i;
    EXPECT_EQ(pa[i], pb[i]) << "element " << i;
  }
}

TEST(PsClientTest, ADifferentSignatureIsRefusedNamingTheFirstDifference) {
  auto server = StartServer(2);
  ClientPtr a = Connect(server->address(), "a");
  Register(a.get(), Ramp(0, 1));
  ClientPtr b = Connect(server->address(), "b");
  std::vector<Tensor> other = Model();
  other[3].shape = {4, 3};
  const std::vector<ps_tensor_spec> specs = Specs(other);
  ps_error error;
  const ps_status status =
      ps_client_register(b.get(), specs.data(), specs.size(), nullptr, 0, 0, nullptr, &error);
  EXPECT_NE(status, PS_OK);
  EXPECT_EQ(error.code, status);
  EXPECT_THAT(error.message, HasSubstr("parameter 'b.weight' has shape [3, 4] on the server "
                                       "but [4, 3] on the worker"));
  // Refused, not registered: pushing is still out of order.
  ps_handle* handle = nullptr;
  std::vector<float> gradient(kElements);
  EXPECT_EQ(ps_client_push(b.get(), 0, 1, 0, 1, gradient.data(), gradient.size(), &handle, &error),
            PS_FAILED_PRECONDITION);
  EXPECT_EQ(handle, nullptr);
}

TEST(PsClientTest, ANonFiniteGradientIsRefusedNamingTheTensor) {
  auto server = StartServer(1);
  ClientPtr a = Connect(server->address(), "a");
  Register(a.get(), Ramp(0, 1));
  std::vector<float> gradient = Ramp(0, 0.1f);
  gradient[20] = NAN;  // b.weight's element 8
  HandlePtr push = Push(a.get(), 0, 1, 0, static_cast<int>(Segments(a.get())), gradient);
  ps_error error;
  EXPECT_EQ(Wait(push.get(), &error), PS_INVALID_ARGUMENT);
  EXPECT_THAT(error.message, HasSubstr("'b.weight' is nan"));
  EXPECT_EQ(server->domain().version(), 0);
}

TEST(PsClientTest, NoServerIsAnErrorWithinTheConnectTimeout) {
  ps_options options = Options("127.0.0.1:1", "lonely");  // nothing listens on port 1
  options.connect_timeout_ms = 300;
  struct Log {
    absl::Mutex mu;
    std::vector<std::string> lines;
  } log;
  options.log = [](void* context, const char* line) {
    Log* l = static_cast<Log*>(context);
    absl::MutexLock lock(&l->mu);
    l->lines.emplace_back(line);
  };
  options.log_context = &log;
  ClientPtr client = Connect(options);
  const std::vector<Tensor> model = Model();
  const std::vector<ps_tensor_spec> specs = Specs(model);
  ps_error error;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(
      ps_client_register(client.get(), specs.data(), specs.size(), nullptr, 0, 0, nullptr, &error),
      PS_UNAVAILABLE);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_THAT(error.message, HasSubstr("127.0.0.1:1"));
  absl::MutexLock lock(&log.mu);
  EXPECT_FALSE(log.lines.empty()) << "register's retries are logged";
}

TEST(PsClientTest, AServerThatGoesAwayFailsPushesAndPullsWithoutHanging) {
  auto server = StartServer(1);
  ps_options options = Options(server->address(), "a");
  options.rpc_timeout_ms = 2000;
  options.wait_timeout_ms = 2000;
  ClientPtr a = Connect(options);
  Register(a.get(), Ramp(0, 1));
  server.reset();
  const auto start = std::chrono::steady_clock::now();
  std::vector<float> gradient = Ramp(0, 1), params(kElements);
  HandlePtr push = Push(a.get(), 0, 1, 0, 6, gradient);
  HandlePtr pull = Pull(a.get(), 1, 0, 6, params);
  ps_error error;
  const ps_status pushed = Wait(push.get(), &error);
  EXPECT_NE(pushed, PS_OK);
  EXPECT_TRUE(pushed == PS_UNAVAILABLE || pushed == PS_DEADLINE_EXCEEDED) << error.message;
  EXPECT_NE(Wait(pull.get(), &error), PS_OK);
  EXPECT_NE(ps_client_wait_for_version(a.get(), 1, &error), PS_OK);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

TEST(PsClientTest, CallsOutOfOrderOrWithBadArgumentsAreRefusedByName) {
  ps_error error;
  ps_options options;
  EXPECT_EQ(ps_options_init(&options, PS_CLIENT_ABI_VERSION + 1, &error), PS_FAILED_PRECONDITION);
  EXPECT_THAT(error.message, HasSubstr("ABI 2"));
  EXPECT_EQ(ps_options_init(nullptr, PS_CLIENT_ABI_VERSION, &error), PS_INVALID_ARGUMENT);
  EXPECT_THAT(error.message, HasSubstr("options is NULL"));
  // Also without an error struct.
  EXPECT_EQ(ps_options_init(nullptr, PS_CLIENT_ABI_VERSION, nullptr), PS_INVALID_ARGUMENT);

  ps_client* client = nullptr;
  options = Options("", "a");
  EXPECT_EQ(ps_client_connect(&options, &client, &error), PS_INVALID_ARGUMENT);
  EXPECT_THAT(error.message, HasSubstr("servers is empty"));
  options = Options("127.0.0.1:1", "a");
  options.compression = "zip";
  EXPECT_EQ(ps_client_connect(&options, &client, &error), PS_INVALID_ARGUMENT);
  EXPECT_THAT(error.message, HasSubstr("zip"));
  options = Options("127.0.0.1:1", "a");
  options.connections = 0;
  EXPECT_EQ(ps_client_connect(&options, &client, &error), PS_INVALID_ARGUMENT);
  EXPECT_THAT(error.message, HasSubstr("connections is 0"));
  options = Options("127.0.0.1:1", "a");
  options.tls_ca_file = "/nonexistent/ca.pem";
  EXPECT_NE(ps_client_connect(&options, &client, &error), PS_OK);
  EXPECT_THAT(error.message, HasSubstr("/nonexistent/ca.pem"));
  options = Options("127.0.0.1:1", "a");
  options.job_token = "short";
  EXPECT_EQ(ps_client_connect(&options, &client, &error), PS_INVALID_ARGUMENT);
  options = Options("127.0.0.1:1", "a");
  options.identity_file = "/nonexistent/dir/a.identity";
  EXPECT_NE(ps_client_connect(&options, &client, &error), PS_OK);
  EXPECT_THAT(error.message, HasSubstr("/nonexistent/dir/a.identity"));
  options = Options("127.0.0.1:1", "a");
  options.abi_version = 7;
  EXPECT_EQ(ps_client_connect(&options, &client, &error), PS_FAILED_PRECONDITION);
  EXPECT_EQ(client, nullptr);

  auto server = StartServer(1);
  ClientPtr a = Connect(server->address(), "a");
  std::vector<float> buffer = Ramp(0, 1);
  ps_handle* handle = nullptr;
  EXPECT_EQ(ps_client_push(a.get(), 0, 1, 0, 1, buffer.data(), buffer.size(), &handle, &error),
            PS_FAILED_PRECONDITION);
  EXPECT_THAT(error.message, HasSubstr("push before register"));
  EXPECT_EQ(ps_client_pull_all(a.get(), 0, buffer.data(), buffer.size(), nullptr, &error),
            PS_FAILED_PRECONDITION);
  EXPECT_EQ(ps_client_registration(a.get(), nullptr, &error), PS_INVALID_ARGUMENT);
  ps_registration registration;
  EXPECT_EQ(ps_client_registration(a.get(), &registration, &error), PS_FAILED_PRECONDITION);
  EXPECT_EQ(ps_client_push(nullptr, 0, 1, 0, 1, buffer.data(), buffer.size(), &handle, &error),
            PS_INVALID_ARGUMENT);
  EXPECT_THAT(error.message, HasSubstr("ps_client_push: the client is NULL"));

  // Register's own checks, each naming the tensor.
  std::vector<Tensor> model = Model();
  model[2].dtype = PS_DTYPE_BF16;
  std::vector<ps_tensor_spec> specs = Specs(model);
  EXPECT_EQ(ps_client_register(a.get(), specs.data(), specs.size(), nullptr, 0, 0, nullptr, &error),
            PS_INVALID_ARGUMENT);
  EXPECT_THAT(error.message, HasSubstr("tensor 2 ('b.bias') has dtype BF16"));
  model = Model();
  model[1].name = "a.weight";
  specs = Specs(model);
  EXPECT_EQ(ps_client_register(a.get(), specs.data(), specs.size(), nullptr, 0, 0, nullptr, &error),
            PS_INVALID_ARGUMENT);
  EXPECT_THAT(error.message, HasSubstr("tensor 1 ('a.weight')"));
  model = Model();
  model[3].shape = {3, -4};
  specs = Specs(model);
  EXPECT_EQ(ps_client_register(a.get(), specs.data(), specs.size(), nullptr, 0, 0, nullptr, &error),
            PS_INVALID_ARGUMENT);
  EXPECT_THAT(error.message, HasSubstr("[3, -4]"));
  const std::vector<Tensor> good = Model();
  specs = Specs(good);
  specs[0].name = nullptr;
  EXPECT_EQ(ps_client_register(a.get(), specs.data(), specs.size(), nullptr, 0, 0, nullptr, &error),
            PS_INVALID_ARGUMENT);
  EXPECT_THAT(error.message, HasSubstr("tensor 0 has a NULL name"));
  specs = Specs(good);
  EXPECT_EQ(
      ps_client_register(a.get(), specs.data(), specs.size(), buffer.data(), 3, 0, nullptr, &error),
      PS_INVALID_ARGUMENT);
  EXPECT_THAT(error.message, HasSubstr("the initial values hold 3 elements; the model has 24"));
  EXPECT_EQ(
      ps_client_register(a.get(), specs.data(), specs.size(), nullptr, 0, -1, nullptr, &error),
      PS_INVALID_ARGUMENT);

  Register(a.get(), buffer);
  EXPECT_EQ(ps_client_register(a.get(), specs.data(), specs.size(), nullptr, 0, 0, nullptr, &error),
            PS_FAILED_PRECONDITION);
  EXPECT_THAT(error.message, HasSubstr("registered already"));
  // Ranges and sizes.
  EXPECT_EQ(ps_client_push(a.get(), 0, 1, 2, 7, buffer.data(), buffer.size(), &handle, &error),
            PS_INVALID_ARGUMENT);
  EXPECT_THAT(error.message, HasSubstr("push of segments [2, 7): the model has 6 segments"));
  EXPECT_EQ(ps_client_pull(a.get(), 1, 3, 2, buffer.data(), buffer.size(), &handle, &error),
            PS_INVALID_ARGUMENT);
  EXPECT_EQ(ps_client_push(a.get(), 0, 1, 0, 1, buffer.data(), 5, &handle, &error),
            PS_INVALID_ARGUMENT);
  EXPECT_THAT(error.message, HasSubstr("buffer of 5 elements; the model has 24"));
  EXPECT_EQ(ps_client_push(a.get(), -1, 1, 0, 1, buffer.data(), buffer.size(), &handle, &error),
            PS_INVALID_ARGUMENT);
  EXPECT_EQ(ps_client_push(a.get(), 0, 1, 0, 1, nullptr, 24, &handle, &error), PS_INVALID_ARGUMENT);
  EXPECT_THAT(error.message, HasSubstr("the buffer is NULL"));
  EXPECT_EQ(handle, nullptr);
  std::vector<int64_t> ends(2);
  int64_t count = 0;
  EXPECT_EQ(ps_client_segment_ends(a.get(), ends.data(), ends.size(), &count, &error),
            PS_INVALID_ARGUMENT);
  EXPECT_EQ(count, 6);
  EXPECT_THAT(error.message, HasSubstr("capacity 2 for 6 segments"));

  // A blocking call while a pull is in flight (held: nobody pushed).
  HandlePtr pull = Pull(a.get(), 1, 0, 1, buffer);
  EXPECT_EQ(ps_client_pull_all(a.get(), 0, buffer.data(), buffer.size(), nullptr, &error),
            PS_FAILED_PRECONDITION);
  EXPECT_THAT(error.message, HasSubstr("pull_all while 1 pushes and pulls are in flight"));
  const std::vector<float> zeros(kElements);  // read until the push is done
  HandlePtr push = Push(a.get(), 0, 1, 0, 6, zeros);
  ASSERT_EQ(Wait(push.get(), &error), PS_OK) << error.message;
  ASSERT_EQ(Wait(pull.get(), &error), PS_OK) << error.message;
  // Done: nothing in flight any more.
  ASSERT_EQ(ps_client_wait_for_version(a.get(), 1, &error), PS_OK) << error.message;
  EXPECT_EQ(error.code, PS_OK);
  EXPECT_STREQ(error.message, "");
}

// Every client pushes one segment per thread, from as many threads as
// segments, and pulls them the same way.
TEST(PsClientTest, ConcurrentPushesAndPullsOfDifferentSegmentsFromSeveralThreads) {
  auto server = StartServer(2);
  ClientPtr a = Connect(server->address(), "a");
  ClientPtr b = Connect(server->address(), "b");
  const std::vector<float> initial = Ramp(0.5f, 0.5f);
  Register(a.get(), initial);
  Register(b.get(), {});
  const std::vector<std::vector<float>> gradients = {Ramp(1.f, 0.25f), Ramp(-2.f, 0.75f)};
  std::vector<std::vector<float>> params(2, std::vector<float>(kElements));
  const int segments = static_cast<int>(Segments(a.get()));
  std::vector<std::thread> threads;
  absl::Mutex mu;
  std::vector<std::string> failures;
  for (int c = 0; c < 2; ++c) {
    ps_client* client = c == 0 ? a.get() : b.get();
    for (int s = 0; s < segments; ++s) {
      threads.emplace_back([&, client, c, s] {
        ps_handle* push = nullptr;
        ps_handle* pull = nullptr;
        ps_error error;
        int32_t done = 0;
        ps_status status =
            ps_client_push(client, 0, 2, s, s + 1, gradients[c].data(), kElements, &push, &error);
        if (status == PS_OK) status = ps_handle_wait(push, -1, &done, &error);
        if (status == PS_OK) {
          status = ps_client_pull(client, 1, s, s + 1, params[c].data(), kElements, &pull, &error);
        }
        if (status == PS_OK) status = ps_handle_wait(pull, -1, &done, &error);
        ps_handle_free(push);
        ps_handle_free(pull);
        if (status != PS_OK) {
          absl::MutexLock lock(&mu);
          failures.push_back(absl::StrCat("client ", c, " segment ", s, ": ", error.message));
        }
      });
    }
  }
  for (std::thread& t : threads) t.join();
  ASSERT_TRUE(failures.empty()) << absl::StrJoin(failures, "\n");
  for (int c = 0; c < 2; ++c) {
    for (int64_t i = 0; i < kElements; ++i) {
      EXPECT_FLOAT_EQ(params[c][i], initial[i] - (gradients[0][i] + gradients[1][i]) / 4.f) << i;
    }
  }
}

TEST(PsClientTest, HandlesPollAndWaitUntilDoneThenKeepTheirStatus) {
  auto server = StartServer(2);
  ClientPtr a = Connect(server->address(), "a");
  ClientPtr b = Connect(server->address(), "b");
  Register(a.get(), Ramp(0, 1));
  Register(b.get(), {});
  std::vector<float> params(kElements);
  // Held by the server until both workers have pushed.
  HandlePtr pull = Pull(a.get(), 1, 0, 6, params);
  int32_t done = -1;
  ps_error error;
  EXPECT_EQ(ps_handle_poll(pull.get(), &done, &error), PS_OK);
  EXPECT_EQ(done, 0);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(ps_handle_wait(pull.get(), 100, &done, &error), PS_OK);
  EXPECT_EQ(done, 0);
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(100));
  EXPECT_EQ(ps_handle_wait(pull.get(), 0, nullptr, &error), PS_INVALID_ARGUMENT);

  const std::vector<float> gradient = Ramp(0, 0.5f);
  HandlePtr push_a = Push(a.get(), 0, 1, 0, 6, gradient);
  HandlePtr push_b = Push(b.get(), 0, 1, 0, 6, gradient);
  EXPECT_EQ(ps_handle_wait(pull.get(), -1, &done, &error), PS_OK) << error.message;
  EXPECT_EQ(done, 1);
  // Done stays done, with the same status, however asked.
  EXPECT_EQ(ps_handle_poll(pull.get(), &done, &error), PS_OK);
  EXPECT_EQ(done, 1);
  EXPECT_EQ(ps_handle_wait(pull.get(), 0, &done, &error), PS_OK);
  EXPECT_EQ(done, 1);

  // A failed operation keeps its error too: a push for an iteration the
  // server is not at.
  HandlePtr stale = Push(a.get(), 5, 1, 0, 6, gradient);
  EXPECT_EQ(Wait(stale.get(), &error), PS_FAILED_PRECONDITION);
  const std::string first_message = error.message;
  EXPECT_THAT(first_message, HasSubstr("iteration 5"));
  EXPECT_EQ(ps_handle_poll(stale.get(), &done, &error), PS_FAILED_PRECONDITION);
  EXPECT_EQ(done, 1);
  EXPECT_EQ(error.message, first_message);
  ps_handle_free(nullptr);
  ps_client_close(nullptr);
}

// Closing waits for what is in flight (here a pull nobody answers, until
// its wait timeout); the handle outlives the client.
TEST(PsClientTest, CloseWaitsForOperationsInFlightAndHandlesOutliveIt) {
  auto server = StartServer(2);
  ps_options options = Options(server->address(), "a");
  options.wait_timeout_ms = 300;
  ClientPtr a = Connect(options);
  Register(a.get(), Ramp(0, 1));
  std::vector<float> params(kElements);
  HandlePtr pull = Pull(a.get(), 1, 0, 6, params);
  a.reset();
  int32_t done = 0;
  ps_error error;
  EXPECT_EQ(ps_handle_poll(pull.get(), &done, &error), PS_DEADLINE_EXCEEDED) << error.message;
  EXPECT_EQ(done, 1);
}

// The sharded store refuses a repeated address quoting it: a message longer
// than the struct holds.
TEST(PsClientTest, LongMessagesAreCutToFitTheErrorStruct) {
  const std::string host(3000, 'y');
  ps_options options = Options(absl::StrCat(host, ":1,", host, ":1"), "a");
  ps_client* client = nullptr;
  ps_error error;
  ASSERT_EQ(ps_client_connect(&options, &client, &error), PS_INVALID_ARGUMENT);
  const std::string message = error.message;
  EXPECT_EQ(message.size(), PS_ERROR_MESSAGE_SIZE - 1);
  EXPECT_EQ(message.substr(0, 14), "shard address ");
  EXPECT_EQ(message.substr(message.size() - 3), "...");
}

}  // namespace
