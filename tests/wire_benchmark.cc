// gRPC goodput of the parameter-server wire on loopback: one worker pushes a
// model's gradient and pulls its parameters through RemoteParameterStore
// against a real gRPC server (in this process, over TCP on 127.0.0.1).
// Prints GB/s of tensor payload for push and pull, one after the other and
// pipelined (each message pulled as soon as its push is accepted); not a
// test. Before each round a plain TCP stream on loopback moves the same
// bytes (iperf3's one-stream yardstick, LoopbackStream), and each figure is
// also given as the median over rounds of its ratio to that round's stream.
// It prints minor page faults per round beside them (a push's land on the
// servers, a pull's on the worker). The first --warmup_rounds rounds are
// left out of every figure, as a training step's steady state would. With
// --servers=S the model is cut over S servers (worker/shard_plan.h) and the
// worker talks to all of them at once through ShardedParameterStore; a list
// (--servers=1,2,4) measures each in turn. With --security=plaintext,tls,mtls
// each server count is measured over plaintext, TLS and mutual TLS with the
// job token (as a secured job runs), certificates from --tls_dir (made by
// deploy/tls/make_test_certs.sh), and the figures compared at the end.
//
//   bazel run //tests:wire_benchmark -- --model_mib=64 --rounds=10 --servers=1,2,4
//   deploy/tls/make_test_certs.sh /tmp/certs
//   bazel run //tests:wire_benchmark -- --security=plaintext,tls,mtls --tls_dir=/tmp/certs

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/cpu_device.h"
#include "common/page_faults.h"
#include "common/process_tuning.h"
#include "common/timed_event.h"
#include "common/tls_credentials.h"
#include "server/grpc_service.h"
#include "server/parameter_server.h"
#include "worker/push_pull_scheduler.h"
#include "worker/remote_parameter_store.h"
#include "worker/sharded_parameter_store.h"
#include "worker/shard_plan.h"

ABSL_FLAG(int64_t, model_mib, 64, "model size in MiB of fp32");
ABSL_FLAG(int64_t, tensors, 8, "tensors the model is cut into");
ABSL_FLAG(int64_t, rounds, 10, "push/wait/pull rounds measured (after the warm-up rounds)");
ABSL_FLAG(int64_t, warmup_rounds, 3,
          "rounds run first and left out of every figure: connections and the allocator "
          "warm up (a training step's steady state)");
ABSL_FLAG(int64_t, chunk_bytes, ps::server::ParameterServerOptions::kDefaultChunkElements * 4,
          "chunk size in bytes");
ABSL_FLAG(int, connections, 1, "connections per direction to each server");
ABSL_FLAG(bool, shared_memory, false,
          "tensor bytes through memory shared with the servers (RemoteStoreOptions::"
          "shared_memory) instead of loopback TCP; gRPC carries the headers");
ABSL_FLAG(std::string, servers, "1",
          "server shards (in-process servers) the model is cut over; a comma-separated list "
          "measures each");
ABSL_FLAG(std::string, security, "plaintext",
          "plaintext, tls (server certificate) or mtls (mutual TLS and the job token); a "
          "comma-separated list measures each");
ABSL_FLAG(std::string, tls_dir, "",
          "certificates for --security=tls/mtls: ca.pem, server.pem/.key, w0.pem/.key "
          "(deploy/tls/make_test_certs.sh DIR)");

namespace ps {
namespace {

// Sums the server's own time per kind of event: what of a push is the
// domain's checking, summing and update rather than the wire.
class ServerTime : public EventObserver {
 public:
  void OnEvent(const TimedEvent& event) override {
    std::lock_guard<std::mutex> lock(mu_);
    const double s = static_cast<double>(event.end_ns - event.start_ns) * 1e-9;
    if (event.kind == EventKind::kServerPush) push_s_ += s;
    if (event.kind == EventKind::kServerUpdate) update_s_ += s;
  }
  void Reset() {
    std::lock_guard<std::mutex> lock(mu_);
    push_s_ = update_s_ = 0;
  }
  double push_s() {
    std::lock_guard<std::mutex> lock(mu_);
    return push_s_;
  }
  double update_s() {
    std::lock_guard<std::mutex> lock(mu_);
    return update_s_;
  }

 private:
  std::mutex mu_;
  double push_s_ = 0, update_s_ = 0;
};

double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The yardstick, measured round by round beside the store: one TCP stream
// on 127.0.0.1 moving the same bytes as iperf3 does (128 KiB writes into
// the socket, a reader thread draining it into a 128 KiB buffer), so that
// the ratio of each round is taken on the same machine in the same seconds
// (this VM's loopback rate moves by ±20 % from one minute to the next).
class LoopbackStream {
 public:
  static std::unique_ptr<LoopbackStream> Open() {
    std::unique_ptr<LoopbackStream> s(new LoopbackStream());
    const int listener = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    if (listener < 0 || bind(listener, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
        listen(listener, 1) != 0 ||
        getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      std::perror("loopback stream: listen");
      if (listener >= 0) close(listener);
      return nullptr;
    }
    s->sender_ = socket(AF_INET, SOCK_STREAM, 0);
    if (s->sender_ < 0 ||
        connect(s->sender_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
      std::perror("loopback stream: connect");
      close(listener);
      return nullptr;
    }
    s->receiver_ = accept(listener, nullptr, nullptr);
    close(listener);
    if (s->receiver_ < 0) {
      std::perror("loopback stream: accept");
      return nullptr;
    }
    s->reader_ = std::thread([p = s.get()] { p->Drain(); });
    return s;
  }
  ~LoopbackStream() {
    if (sender_ >= 0) close(sender_);  // the reader sees the end and stops
    if (reader_.joinable()) reader_.join();
    if (receiver_ >= 0) close(receiver_);
  }
  // Seconds to move `bytes` from `data` to the reader (until it has read
  // the last byte); negative if the stream failed.
  double Send(const char* data, int64_t bytes) {
    const auto start = std::chrono::steady_clock::now();
    {
      std::lock_guard<std::mutex> lock(mu_);
      expected_ += bytes;
    }
    for (int64_t sent = 0; sent < bytes;) {
      const ssize_t n = write(sender_, data + sent, std::min<int64_t>(kBlock, bytes - sent));
      if (n <= 0) return -1;
      sent += n;
    }
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return received_ >= expected_ || failed_; });
    if (failed_) return -1;
    return Since(start);
  }

 private:
  static constexpr int64_t kBlock = 128 << 10;  // iperf3's TCP block
  LoopbackStream() = default;
  void Drain() {
    std::vector<char> buffer(kBlock);
    for (;;) {
      const ssize_t n = read(receiver_, buffer.data(), buffer.size());
      std::lock_guard<std::mutex> lock(mu_);
      if (n <= 0) {
        failed_ = true;
        cv_.notify_all();
        return;
      }
      received_ += n;
      if (received_ >= expected_) cv_.notify_all();
    }
  }
  int sender_ = -1, receiver_ = -1;
  std::thread reader_;
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t expected_ = 0, received_ = 0;
  bool failed_ = false;
};

// CPU seconds this process has used (user and system, every thread): on
// these 2 shared cores a round's CPU says what the wire costs when the
// load makes its GB/s noise.
double ProcessCpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + 1e-6 * t.tv_usec; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t m = values.size() / 2;
  return values.size() % 2 == 1 ? values[m] : 0.5 * (values[m - 1] + values[m]);
}

// A parameter server on a free loopback port of this process, as
// server/in_process_server.h makes one, with the daemon's credentials.
class BenchServer {
 public:
  static std::unique_ptr<BenchServer> Start(const server::ParameterServerOptions& options,
                                            std::vector<ParamSpec> signature,
                                            std::vector<float> initial,
                                            const ServerTlsOptions& tls,
                                            const std::string& job_token) {
    std::unique_ptr<BenchServer> s(new BenchServer());
    auto server = server::ParameterServer::Create(options, std::move(signature),
                                                  std::move(initial), &s->device_);
    auto credentials = MakeServerCredentials(tls);
    if (!server.ok() || !credentials.ok()) {
      std::fprintf(stderr, "%s\n",
                   (server.ok() ? credentials.status() : server.status()).ToString().c_str());
      return nullptr;
    }
    s->server_ = std::move(server).value();
    server::ServiceOptions service_options;
    service_options.job_token = job_token;
    // As the server daemon: under mutual TLS a worker registers as its
    // certificate's name.
    service_options.client_certificates = !tls.client_ca_file.empty();
    s->service_ = std::make_unique<server::ParameterServerService>(s->server_.get(),
                                                                   service_options);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", *credentials, &s->port_);
    builder.RegisterService(s->service_.get());
    s->grpc_server_ = builder.BuildAndStart();
    if (s->grpc_server_ == nullptr || s->port_ == 0) {
      std::fprintf(stderr, "cannot listen on a loopback port\n");
      return nullptr;
    }
    return s;
  }
  ~BenchServer() {
    // Waiting pulls first: the server's Shutdown waits for every call in flight.
    if (service_ != nullptr) service_->Shutdown();
    if (grpc_server_ != nullptr) grpc_server_->Shutdown();
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  BenchServer() = default;
  CpuDevice device_{0, 1};
  std::unique_ptr<server::ParameterServer> server_;
  std::unique_ptr<server::ParameterServerService> service_;
  std::unique_ptr<grpc::Server> grpc_server_;
  int port_ = 0;
};

// Goodput of one run, in GB/s of tensor payload.
struct Figures {
  double push = 0, pull = 0, pipelined = 0;
};

// Minor page faults per round, the warm-up rounds left out: the steady
// state a training step sees. Client and servers share this
// process, so each phase's count is both sides': a push's received bytes
// land on the servers, a pull's on the worker.
struct RoundFaults {
  std::vector<double> push, pull, pipelined;
  double cpu_s = 0;  // CPU seconds of the measured rounds, both phases and both loops
  static std::string Describe(const std::vector<double>& faults) {
    if (faults.empty()) return "-";
    const auto [low, high] = std::minmax_element(faults.begin(), faults.end());
    return absl::StrCat(static_cast<int64_t>(Median(faults)), " (", static_cast<int64_t>(*low),
                        "-", static_cast<int64_t>(*high), ")");
  }
};

// The servers of one run and the worker's store registered with them
// (declared in that order, so the store goes first).
struct Job {
  std::vector<std::unique_ptr<BenchServer>> servers;
  std::unique_ptr<worker::ParameterStore> store;
  worker::RemoteStoreOptions store_options;
  int64_t version = 0;  // the registration's
};

// Starts a server per shard of `signature` and registers a store with them,
// with the credentials of `security` ("plaintext", "tls" or "mtls", checked
// by main()); null, the reason printed, when something fails.
std::unique_ptr<Job> StartJob(int shards, const std::string& security,
                              const std::vector<ParamSpec>& signature,
                              const server::ParameterServerOptions& options) {
  auto job = std::make_unique<Job>();
  // Each shard starts from its part of the plan, so no initial parameters
  // travel.
  auto plan = worker::PlanShards(signature, shards);
  if (!plan.ok()) {
    std::fprintf(stderr, "%s\n", plan.status().ToString().c_str());
    return nullptr;
  }
  const std::string dir = absl::GetFlag(FLAGS_tls_dir) + "/";
  ServerTlsOptions server_tls;
  worker::RemoteStoreOptions& store_options = job->store_options;
  std::string job_token;
  if (security != "plaintext") {
    server_tls.cert_file = dir + "server.pem";
    server_tls.key_file = dir + "server.key";
    store_options.tls.ca_file = dir + "ca.pem";
  }
  if (security == "mtls") {
    server_tls.client_ca_file = dir + "ca.pem";
    store_options.tls.cert_file = dir + "w0.pem";
    store_options.tls.key_file = dir + "w0.key";
    job_token = "wire-benchmark-job-token";
    store_options.job_token = job_token;
  }
  std::vector<std::string> addresses;
  for (const worker::ShardPart& part : plan->shards) {
    auto server = BenchServer::Start(options, part.signature(),
                                     std::vector<float>(part.elements(), 0.5f), server_tls,
                                     job_token);
    if (server == nullptr) return nullptr;
    addresses.push_back(server->address());
    job->servers.push_back(std::move(server));
  }

  store_options.server_address = addresses[0];
  store_options.worker_id = security == "mtls" ? "w0" : "bench";  // w0.pem names w0
  store_options.connections = absl::GetFlag(FLAGS_connections);
  store_options.shared_memory = absl::GetFlag(FLAGS_shared_memory);
  if (shards == 1) {
    auto remote = worker::RemoteParameterStore::Create(store_options);
    if (remote.ok()) job->store = std::move(remote).value();
    if (!remote.ok()) std::fprintf(stderr, "%s\n", remote.status().ToString().c_str());
  } else {
    worker::ShardedStoreOptions sharded;
    sharded.shard_addresses = addresses;
    sharded.remote = store_options;
    auto remote = worker::ShardedParameterStore::Create(sharded);
    if (remote.ok()) job->store = std::move(remote).value();
  }
  if (job->store == nullptr) {
    std::fprintf(stderr, "cannot make the store\n");
    return nullptr;
  }
  auto reg = job->store->Register(signature, {});
  if (!reg.ok()) {
    std::fprintf(stderr, "%s\n", reg.status().ToString().c_str());
    return nullptr;
  }
  job->version = reg->version;
  return job;
}

// What the measured rounds took, summed, and per round.
struct Measured {
  double push_s = 0, wait_s = 0, pull_s = 0, pipelined_s = 0;
  double stream_s = 0;  // the yardstick's, before each round of both loops
  // Per round: each store figure as a fraction of the stream's rate in
  // that round.
  std::vector<double> push_ratio, pull_ratio, pipelined_ratio;
  RoundFaults faults;
};

void PrintRun(int shards, const std::string& security, const Job& job,
              const server::ParameterServerOptions& options, double bytes, int64_t warmup,
              int64_t rounds, ServerTime& server_time, const Measured& m) {
  const worker::RemoteStoreOptions& store_options = job.store_options;
  std::printf("model %.1f MiB in %lld tensors on %d server%s (%d connection%s each way), chunks "
              "of %lld bytes, %lld rounds on loopback, %s%s\n",
              bytes / (1 << 20), static_cast<long long>(absl::GetFlag(FLAGS_tensors)), shards,
              shards > 1 ? "s" : "", store_options.connections,
              store_options.connections > 1 ? "s" : "",
              static_cast<long long>(options.chunk_elements * 4), static_cast<long long>(rounds),
              security.c_str(),
              store_options.shared_memory ? ", tensor bytes through shared memory" : "");
  std::printf("push: %8.2f ms  %6.2f GB/s (includes the server summing the gradient and, in\n"
              "                           the last chunk's call, the SGD update)\n",
              1e3 * m.push_s / rounds, bytes * rounds / m.push_s / 1e9);
  std::printf("      of which the server%s for %.2f ms and update%s for %.2f ms%s\n",
              shards > 1 ? "s check and sum" : " checks and sums", 1e3 * server_time.push_s() / rounds,
              shards > 1 ? "" : "s", 1e3 * server_time.update_s() / rounds,
              shards > 1 ? " (summed over the shards, which run at once)" : "");
  std::printf("wait: %8.2f ms\n", 1e3 * m.wait_s / rounds);
  std::printf("pull: %8.2f ms  %6.2f GB/s\n", 1e3 * m.pull_s / rounds,
              bytes * rounds / m.pull_s / 1e9);
  std::printf("push and pull pipelined (a step's traffic, a bucket per message): %8.2f ms, "
              "%6.2f GB/s each way\n",
              1e3 * m.pipelined_s / rounds, bytes * rounds / m.pipelined_s / 1e9);
  std::printf("one TCP stream on loopback (the iperf3 yardstick, a round before each): %6.2f "
              "GB/s;\n  median over rounds of each figure / that round's stream: push %.2f, "
              "pull %.2f, pipelined %.2f each way\n",
              bytes * 2 * rounds / m.stream_s / 1e9, Median(m.push_ratio), Median(m.pull_ratio),
              Median(m.pipelined_ratio));
  std::printf("minor page faults per round, median (range) of the rounds after the %lld warm-up "
              "rounds, of %lld pages moved each way:\n  push (and wait; the servers receive) %s, "
              "pull (the worker receives) %s, pipelined %s\n",
              static_cast<long long>(warmup), static_cast<long long>(bytes / 4096),
              RoundFaults::Describe(m.faults.push).c_str(),
              RoundFaults::Describe(m.faults.pull).c_str(),
              RoundFaults::Describe(m.faults.pipelined).c_str());
  // Each measured round receives the model twice (a push and a pull), in
  // both loops.
  std::printf("CPU (user + system, client and servers) per GB of tensor payload received: "
              "%.2f s\n",
              m.faults.cpu_s / (bytes * 4 * rounds / 1e9));
}

// `security`: "plaintext", "tls" or "mtls" (checked by main()).
int Run(int shards, const std::string& security, Figures* figures) {
  const int64_t elements = absl::GetFlag(FLAGS_model_mib) * (int64_t{1} << 20) / 4;
  const int64_t tensors = absl::GetFlag(FLAGS_tensors);
  std::vector<ParamSpec> signature;
  for (int64_t t = 0; t < tensors; ++t) {
    signature.push_back({absl::StrCat("layer", t, ".weight"), {elements / tensors}, DType::kF32});
  }
  const int64_t n = (elements / tensors) * tensors;
  server::ParameterServerOptions options;
  options.num_workers = 1;
  options.optimizer.sgd.lr = 1e-6f;
  options.chunk_elements = absl::GetFlag(FLAGS_chunk_bytes) / 4;
  ServerTime server_time;
  options.observer = &server_time;
  std::unique_ptr<Job> job = StartJob(shards, security, signature, options);
  if (job == nullptr) return 1;
  worker::ParameterStore* store = job->store.get();
  std::vector<float> grad(n, 1e-3f), params(n);
  const int64_t rounds = absl::GetFlag(FLAGS_rounds);
  const int64_t warmup = std::max<int64_t>(1, absl::GetFlag(FLAGS_warmup_rounds));
  const double bytes = static_cast<double>(n) * 4;
  std::unique_ptr<LoopbackStream> stream = LoopbackStream::Open();
  if (stream == nullptr) return 1;
  auto stream_round = [&]() -> double {
    const double s =
        stream->Send(reinterpret_cast<const char*>(grad.data()), static_cast<int64_t>(bytes));
    if (s < 0) std::fprintf(stderr, "the loopback stream failed\n");
    return s;
  };
  auto failed = [](const absl::Status& s) {
    if (!s.ok()) std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return !s.ok();
  };
  Measured m;
  int64_t version = job->version;
  for (int64_t r = -warmup; r < rounds; ++r) {
    const double yardstick = stream_round();
    if (yardstick < 0) return 1;
    const int64_t faults_before_push = ProcessMinorFaults();
    const double cpu_before = ProcessCpuSeconds();
    auto t = std::chrono::steady_clock::now();
    if (failed(store->Push(version, 1, grad))) return 1;
    const double push = Since(t);
    t = std::chrono::steady_clock::now();
    if (failed(store->WaitForVersion(version + 1))) return 1;
    const double wait = Since(t);
    const int64_t faults_before_pull = ProcessMinorFaults();
    t = std::chrono::steady_clock::now();
    auto v = store->Pull(version + 1, absl::MakeSpan(params));
    if (failed(v.status())) return 1;
    const double pull = Since(t);
    const int64_t faults_after_pull = ProcessMinorFaults();
    const double cpu_after = ProcessCpuSeconds();
    version = *v;
    if (r == -1) server_time.Reset();
    if (r >= 0) {  // the rounds before warm up connections and allocations
      m.push_s += push;
      m.wait_s += wait;
      m.pull_s += pull;
      m.stream_s += yardstick;
      m.push_ratio.push_back(yardstick / push);
      m.pull_ratio.push_back(yardstick / pull);
      m.faults.push.push_back(static_cast<double>(faults_before_pull - faults_before_push));
      m.faults.pull.push_back(static_cast<double>(faults_after_pull - faults_before_pull));
      m.faults.cpu_s += cpu_after - cpu_before;
    }
  }
  // Pipelined: one step's traffic through the push/pull scheduler, each
  // message's pull started as soon as its push is accepted, so both
  // directions of the connection pairs carry bytes at once.
  worker::PushPullOptions pipeline;
  pipeline.bucket_bytes = 0;  // a bucket per message
  auto scheduler = worker::PushPullScheduler::Create(pipeline, store, grad,
                                                     absl::MakeSpan(params), version);
  if (failed(scheduler.status())) return 1;
  for (int64_t r = -warmup; r < rounds; ++r) {
    const double yardstick = stream_round();
    if (yardstick < 0) return 1;
    const int64_t faults_before = ProcessMinorFaults();
    const double cpu_before = ProcessCpuSeconds();
    const auto t = std::chrono::steady_clock::now();
    absl::Status s = (*scheduler)->BeginIteration(1);
    if (s.ok()) {
      (*scheduler)->GradientsReadyFrom(0);
      s = (*scheduler)->AwaitAll();
    }
    if (failed(s)) return 1;
    if (r >= 0) {
      const double step = Since(t);
      m.pipelined_s += step;
      m.stream_s += yardstick;
      m.pipelined_ratio.push_back(yardstick / step);
      m.faults.pipelined.push_back(static_cast<double>(ProcessMinorFaults() - faults_before));
      m.faults.cpu_s += ProcessCpuSeconds() - cpu_before;
    }
  }
  figures->push = bytes * rounds / m.push_s / 1e9;
  figures->pull = bytes * rounds / m.pull_s / 1e9;
  figures->pipelined = bytes * rounds / m.pipelined_s / 1e9;
  PrintRun(shards, security, *job, options, bytes, warmup, rounds, server_time, m);
  return 0;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  ps::TuneMallocForLargeMessages();
  ps::DisableMutexDeadlockDetection();
  absl::ParseCommandLine(argc, argv);
  const std::vector<std::string> securities =
      absl::StrSplit(absl::GetFlag(FLAGS_security), ',');
  for (const std::string& security : securities) {
    if (security != "plaintext" && security != "tls" && security != "mtls") {
      std::fprintf(stderr, "--security: '%s' is not plaintext, tls or mtls\n", security.c_str());
      return 2;
    }
    if (security != "plaintext" && absl::GetFlag(FLAGS_tls_dir).empty()) {
      std::fprintf(stderr, "--security=%s needs --tls_dir\n", security.c_str());
      return 2;
    }
  }
  for (absl::string_view text : absl::StrSplit(absl::GetFlag(FLAGS_servers), ',')) {
    int shards = 0;
    if (!absl::SimpleAtoi(text, &shards) || shards < 1) {
      std::fprintf(stderr, "--servers: '%s' is not a positive number\n", std::string(text).c_str());
      return 2;
    }
    std::vector<ps::Figures> figures(securities.size());
    for (size_t i = 0; i < securities.size(); ++i) {
      if (const int rc = ps::Run(shards, securities[i], &figures[i]); rc != 0) return rc;
    }
    if (securities.size() < 2) continue;
    // Side by side, each against the first.
    std::printf("%d server%s, GB/s (x the %s figure):\n", shards, shards > 1 ? "s" : "",
                securities[0].c_str());
    for (size_t i = 0; i < securities.size(); ++i) {
      const ps::Figures& f = figures[i];
      const ps::Figures& base = figures[0];
      std::printf("  %-9s  push %6.2f (%.2f)  pull %6.2f (%.2f)  pipelined %6.2f (%.2f)\n",
                  securities[i].c_str(), f.push, f.push / base.push, f.pull, f.pull / base.pull,
                  f.pipelined, f.pipelined / base.pipelined);
    }
  }
  return 0;
}
