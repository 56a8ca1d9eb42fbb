// gRPC goodput of the parameter-server wire on loopback: one worker pushes a
// model's gradient and pulls its parameters through RemoteParameterStore
// against a real gRPC server (in this process, over TCP on 127.0.0.1).
// Prints GB/s of tensor payload for push and pull; not a test.
//
//   bazel run //tests:wire_benchmark -- --model_mib=64 --rounds=10

#include <chrono>
#include <cstdio>
#include <memory>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "common/malloc_tuning.h"
#include "server/in_process_server.h"
#include "worker/remote_parameter_store.h"

ABSL_FLAG(int64_t, model_mib, 64, "model size in MiB of fp32");
ABSL_FLAG(int64_t, tensors, 8, "tensors the model is cut into");
ABSL_FLAG(int64_t, rounds, 10, "push/wait/pull rounds measured (after one warm-up)");
ABSL_FLAG(int64_t, chunk_bytes, ps::server::ParameterServerOptions::kDefaultChunkElements * 4,
          "chunk size in bytes");

namespace ps {
namespace {

double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

int Run() {
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
  auto server = server::InProcessServer::Start(options, signature, std::vector<float>(n, 0.5f));
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", server.status().ToString().c_str());
    return 1;
  }

  worker::RemoteStoreOptions store_options;
  store_options.server_address = (*server)->address();
  store_options.worker_id = "bench";
  auto store = worker::RemoteParameterStore::Create(store_options);
  auto reg = (*store)->Register(signature, {});
  if (!reg.ok()) {
    std::fprintf(stderr, "%s\n", reg.status().ToString().c_str());
    return 1;
  }
  std::vector<float> grad(n, 1e-3f), params(n);
  const int64_t rounds = absl::GetFlag(FLAGS_rounds);
  double push_s = 0, wait_s = 0, pull_s = 0;
  int64_t version = reg->version;
  for (int64_t r = 0; r <= rounds; ++r) {
    auto t = std::chrono::steady_clock::now();
    if (auto s = (*store)->Push(version, 1, grad); !s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
    const double push = Since(t);
    t = std::chrono::steady_clock::now();
    if (auto s = (*store)->WaitForVersion(version + 1); !s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
    const double wait = Since(t);
    t = std::chrono::steady_clock::now();
    auto v = (*store)->Pull(version + 1, absl::MakeSpan(params));
    if (!v.ok()) {
      std::fprintf(stderr, "%s\n", v.status().ToString().c_str());
      return 1;
    }
    const double pull = Since(t);
    version = *v;
    if (r > 0) {  // round 0 warms up connections and allocations
      push_s += push;
      wait_s += wait;
      pull_s += pull;
    }
  }
  const double bytes = static_cast<double>(n) * 4;
  std::printf("model %.1f MiB in %lld tensors, chunks of %lld bytes, %lld rounds on loopback\n",
              bytes / (1 << 20), static_cast<long long>(tensors),
              static_cast<long long>(options.chunk_elements * 4), static_cast<long long>(rounds));
  std::printf("push: %8.2f ms  %6.2f GB/s (includes the server summing the gradient and, in\n"
              "                           the last chunk's call, the SGD update)\n",
              1e3 * push_s / rounds, bytes * rounds / push_s / 1e9);
  std::printf("wait: %8.2f ms\n", 1e3 * wait_s / rounds);
  std::printf("pull: %8.2f ms  %6.2f GB/s\n", 1e3 * pull_s / rounds, bytes * rounds / pull_s / 1e9);
  return 0;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  ps::TuneMallocForLargeMessages();
  absl::ParseCommandLine(argc, argv);
  return ps::Run();
}
