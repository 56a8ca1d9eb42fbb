// What single-process training's store costs per step, apart from compute:
// one push of a model's gradient and one pull of its new parameters, for a
// model's real signature, three ways:
//   server, copies    server::ParameterServer with one worker, one chunk per
//                     tensor: what LocalParameterStore was (the gradient
//                     copied into the chunk's sum, an out-of-place update
//                     keeping the previous parameters, the parameters copied
//                     out)
//   local, unbound    LocalParameterStore copying in and out
//   local, bound      LocalParameterStore in the caller's buffers
//                     (BindBuffers): the update in place, no copy
// Prints figures; not a test (tagged "benchmark").
//
//   bazel run //tests:local_parameter_store_benchmark -- --models=lenet,resnet18

#include <chrono>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/cpu_device.h"
#include "server/parameter_server.h"
#include "server/parameter_server_testing.h"
#include "worker/local_parameter_store.h"
#include "worker/model/model.h"

ABSL_FLAG(int64_t, steps, 30, "measured steps per configuration (after 3 warm-up steps)");
ABSL_FLAG(std::string, models, "lenet,resnet18", "models whose signature to use");

namespace ps::worker {
namespace {

using Step = std::function<absl::Status(int64_t iteration)>;

absl::Status Time(const char* label, const std::string& model, int64_t bytes, int64_t steps,
                  const Step& step) {
  for (int64_t it = 0; it < 3; ++it) {
    if (absl::Status s = step(it); !s.ok()) return s;
  }
  const auto start = std::chrono::steady_clock::now();
  for (int64_t it = 3; it < 3 + steps; ++it) {
    if (absl::Status s = step(it); !s.ok()) return s;
  }
  const double ms =
      1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
      steps;
  std::printf("%-9s %-16s %10.1f %10.3f\n", model.c_str(), label, bytes / 1e6, ms);
  return absl::OkStatus();
}

absl::Status Measure(const std::string& name, int64_t steps) {
  CpuDevice device(0, 1);
  model::ModelConfig config;
  config.name = name;
  absl::StatusOr<std::unique_ptr<model::Model>> m = model::Model::Create(config, &device);
  if (!m.ok()) return m.status();
  const std::vector<ParamSpec> signature = (*m)->parameters();
  const int64_t n = model::TotalElements(signature);
  const int64_t bytes = n * static_cast<int64_t>(sizeof(float));
  OptimizerOptions sgd;
  sgd.sgd.lr = 1e-3f;
  sgd.sgd.momentum = 0.9f;
  std::vector<float> initial(n, 0.5f), grad(n, 0.25f), params(n);
  const int64_t samples = 64;

  {
    server::ParameterServerOptions options;
    options.optimizer = sgd;
    options.chunk_elements = std::numeric_limits<int64_t>::max() / 2;
    CpuDevice server_device(0, 1);
    auto server = server::ParameterServer::Create(options, signature, initial, &server_device);
    if (!server.ok()) return server.status();
    auto reg = (*server)->Register("w", signature, -1, 1);
    if (!reg.ok()) return reg.status();
    std::vector<server::ChunkData> in;
    std::vector<server::ChunkOut> out;
    int64_t offset = 0;
    for (int key = 0; key < static_cast<int>(signature.size()); ++key) {
      const int64_t len = NumElements(signature[key].shape);
      in.push_back({key, 0, absl::MakeConstSpan(grad).subspan(offset, len)});
      out.push_back({key, 0, absl::MakeSpan(params).subspan(offset, len)});
      offset += len;
    }
    absl::Status status = Time("server, copies", name, bytes, steps, [&](int64_t it) {
      if (absl::Status s = PushChunks(**server, reg->rank, it, samples, in); !s.ok()) return s;
      return PullChunks(**server, it + 1, absl::Now(), out).status();
    });
    if (!status.ok()) return status;
  }
  for (bool bound : {false, true}) {
    auto store = LocalParameterStore::Create(sgd);
    if (!store.ok()) return store.status();
    if (auto reg = (*store)->Register(signature, initial); !reg.ok()) return reg.status();
    if (bound) {
      if (absl::Status s = (*store)->BindBuffers(grad, absl::MakeSpan(params)); !s.ok()) return s;
    }
    const int segments = static_cast<int>(signature.size());
    absl::Status status =
        Time(bound ? "local, bound" : "local, unbound", name, bytes, steps, [&](int64_t it) {
          absl::Status result;
          (*store)->PushSegments(it, samples, 0, segments, grad,
                                 [&](absl::Status s) { result = s; });
          if (!result.ok()) return result;
          (*store)->PullSegments(it + 1, 0, segments, absl::MakeSpan(params),
                                 [&](absl::Status s) { result = s; });
          return result;
        });
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

int Run() {
  std::printf("one push and one pull per step, 1 optimizer thread, momentum on\n");
  std::printf("%-9s %-16s %10s %10s\n", "model", "store", "model MB", "ms/step");
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_models), ',')) {
    if (absl::Status s = Measure(std::string(name), absl::GetFlag(FLAGS_steps)); !s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace ps::worker

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ps::worker::Run();
}
