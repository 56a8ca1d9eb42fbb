// Push throughput of the ParameterServer domain object (no transport): the
// gradient messages of --workers workers for a model of --chunks chunks
// are pushed by P threads at once, thread t pushing every worker's message
// of each chunk c with c % P == t, so concurrent pushes touch different
// chunks. Each message is one chunk (checked for finite values and summed
// in rank order); the chunk's SGD update runs when its last worker's push
// completes it. Prints messages/s and GB/s of gradient payload for each P in
// --pushers; with one server-wide lock they stay flat as P grows, with
// per-chunk locks they grow up to the cores free. Not a test.
//
//   bazel run //server:parameter_server_benchmark -- --pushers=1,2,4

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/cpu_device.h"
#include "common/process_tuning.h"
#include "server/parameter_server.h"
#include "server/parameter_server_testing.h"

ABSL_FLAG(int, workers, 2, "workers whose gradients are summed per chunk");
ABSL_FLAG(int64_t, chunks, 16, "chunks of the model (each of --chunk_elements)");
ABSL_FLAG(int64_t, chunk_elements, ps::server::ParameterServerOptions::kDefaultChunkElements,
          "elements per chunk (the default: a full 4 MiB message)");
ABSL_FLAG(int64_t, rounds, 10, "iterations measured (after one warm-up)");
ABSL_FLAG(std::string, pushers, "1,2", "concurrent pushing threads; a comma-separated list");
ABSL_FLAG(int, device_threads, 1, "the optimizer's CPU device threads (the server's --threads)");

namespace ps::server {
namespace {

int Run(int pushers) {
  const int workers = absl::GetFlag(FLAGS_workers);
  const int64_t chunks = absl::GetFlag(FLAGS_chunks);
  const int64_t chunk_elements = absl::GetFlag(FLAGS_chunk_elements);
  const int64_t rounds = absl::GetFlag(FLAGS_rounds);
  ParameterServerOptions options;
  options.num_workers = workers;
  options.chunk_elements = chunk_elements;
  options.optimizer.sgd.lr = 1e-6f;
  options.optimizer.sgd.momentum = 0.9f;
  const std::vector<ParamSpec> signature = {{"w", {chunks, chunk_elements}, DType::kF32}};
  CpuDevice device(0, absl::GetFlag(FLAGS_device_threads));
  auto server = ParameterServer::Create(
      options, signature, std::vector<float>(chunks * chunk_elements, 0.5f), &device);
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", server.status().ToString().c_str());
    return 1;
  }
  for (int w = 0; w < workers; ++w) {
    if (auto reg = (*server)->Register("w" + std::to_string(w), signature, w); !reg.ok()) {
      std::fprintf(stderr, "%s\n", reg.status().ToString().c_str());
      return 1;
    }
  }
  const std::vector<float> gradient(chunk_elements, 1e-3f);
  std::chrono::steady_clock::time_point start;
  for (int64_t it = 0; it <= rounds; ++it) {
    if (it == 1) start = std::chrono::steady_clock::now();  // after the warm-up
    std::vector<std::thread> threads;
    std::atomic<bool> failed{false};
    for (int t = 0; t < pushers; ++t) {
      threads.emplace_back([&, t] {
        for (int64_t c = t; c < chunks; c += pushers) {
          for (int w = 0; w < workers; ++w) {
            const absl::Status s = Push(**server, w, it, 0, c, 1, gradient);
            if (!s.ok()) {
              std::fprintf(stderr, "%s\n", s.ToString().c_str());
              failed = true;
              return;
            }
          }
        }
      });
    }
    for (std::thread& thread : threads) thread.join();
    if (failed || (*server)->version() != it + 1) return 1;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double messages = static_cast<double>(rounds * chunks * workers);
  const double bytes = messages * static_cast<double>(chunk_elements) * 4;
  std::printf("%d pusher%s: %8.1f messages/s  %6.2f GB/s of gradient  (%d workers, %lld chunks "
              "of %.2f MB, %lld rounds, %.3f s)\n",
              pushers, pushers == 1 ? " " : "s", messages / seconds, bytes / seconds * 1e-9,
              workers, static_cast<long long>(chunks), chunk_elements * 4 * 1e-6,
              static_cast<long long>(rounds), seconds);
  return 0;
}

}  // namespace
}  // namespace ps::server

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  ps::TuneMallocForLargeMessages();
  ps::DisableMutexDeadlockDetection();
  std::printf("%u cores\n", std::thread::hardware_concurrency());
  for (absl::string_view p : absl::StrSplit(absl::GetFlag(FLAGS_pushers), ',')) {
    int pushers = 0;
    if (!absl::SimpleAtoi(p, &pushers) || pushers < 1) {
      std::fprintf(stderr, "bad --pushers entry '%s'\n", std::string(p).c_str());
      return 1;
    }
    if (const int rc = ps::server::Run(pushers); rc != 0) return rc;
  }
  return 0;
}
