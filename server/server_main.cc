// The parameter-server daemon: holds the model's parameters, sums the pushes
// of --num_workers workers each iteration, applies SGD and serves the new
// version.
//
//   bazel run -c opt //server:server -- --num_workers=2 --model=lenet

#include <pthread.h>

#include <csignal>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "common/cpu_device.h"
#include "common/int_list.h"
#include "common/malloc_tuning.h"
#include "common/status_macros.h"
#include "server/grpc_service.h"
#include "server/parameter_server.h"
#include "worker/model/model.h"
#include "worker/weights.h"

ABSL_FLAG(std::string, bind_address, "127.0.0.1",
          "address to listen on (0.0.0.0 in containers)");
ABSL_FLAG(int, port, 50051, "port to listen on (0: pick a free one)");
ABSL_FLAG(std::string, advertise_address, "",
          "address workers should use, printed at start (default bind_address:port)");
ABSL_FLAG(std::string, port_file, "", "write the bound port here once serving (for launchers)");
ABSL_FLAG(int, num_workers, 1, "workers taking part in every synchronous iteration");
ABSL_FLAG(std::string, model, "lenet", "model whose parameters the server holds");
ABSL_FLAG(std::string, input_shape, "1,28,28", "one sample's shape C,H,W");
ABSL_FLAG(int64_t, num_classes, 10, "classes");
ABSL_FLAG(std::string, mlp_hidden, "256", "mlp hidden widths");
ABSL_FLAG(uint64_t, seed, 0, "seed of the initial parameters");
ABSL_FLAG(std::string, init_weights, "", "safetensors file with the initial parameters");
ABSL_FLAG(double, lr, 0.9, "base learning rate");
ABSL_FLAG(double, momentum, 0.0, "SGD momentum");
ABSL_FLAG(double, weight_decay, 0.0, "L2 weight decay");
ABSL_FLAG(bool, nesterov, false, "Nesterov momentum");
ABSL_FLAG(int64_t, lr_decay_every, 0, "decay the learning rate every this many steps/epochs");
ABSL_FLAG(double, lr_decay_gamma, 0.1, "learning-rate decay factor");
ABSL_FLAG(std::string, lr_decay_unit, "epochs", "epochs or steps");
ABSL_FLAG(int64_t, steps_per_epoch, 0, "iterations per epoch (needed for --lr_decay_unit=epochs)");
ABSL_FLAG(int64_t, chunk_bytes, ps::server::ParameterServerOptions::kDefaultChunkElements * 4,
          "largest tensor chunk per message, in bytes");
ABSL_FLAG(int, threads, 1, "CPU threads for the optimizer");

namespace ps::server {
namespace {

absl::Status Main() {
  // SIGINT/SIGTERM are blocked in every thread (gRPC's inherit the mask) and
  // taken synchronously by sigwait below, so shutdown runs on this thread.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  CpuDevice device(0, std::max(1, absl::GetFlag(FLAGS_threads)));

  // The initial parameters: the model's seeded initialisation, or a file.
  worker::ModelConfig config;
  config.name = absl::GetFlag(FLAGS_model);
  PS_ASSIGN_OR_RETURN(config.input_shape, ParsePositiveIntList("--input_shape", absl::GetFlag(FLAGS_input_shape)));
  config.num_classes = absl::GetFlag(FLAGS_num_classes);
  PS_ASSIGN_OR_RETURN(config.mlp_hidden, ParsePositiveIntList("--mlp_hidden", absl::GetFlag(FLAGS_mlp_hidden)));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<worker::Model> model, worker::Model::Create(config, &device));
  PS_RETURN_IF_ERROR(model->Initialize(absl::GetFlag(FLAGS_seed)));
  if (!absl::GetFlag(FLAGS_init_weights).empty()) {
    PS_RETURN_IF_ERROR(worker::LoadWeights(absl::GetFlag(FLAGS_init_weights), *model));
  }
  PS_ASSIGN_OR_RETURN(std::vector<float> initial, model->flat_parameters().ToVector());

  ParameterServerOptions options;
  options.num_workers = absl::GetFlag(FLAGS_num_workers);
  options.chunk_elements = absl::GetFlag(FLAGS_chunk_bytes) / 4;
  OptimizerOptions& opt = options.optimizer;
  opt.sgd.lr = static_cast<float>(absl::GetFlag(FLAGS_lr));
  opt.sgd.momentum = static_cast<float>(absl::GetFlag(FLAGS_momentum));
  opt.sgd.weight_decay = static_cast<float>(absl::GetFlag(FLAGS_weight_decay));
  opt.sgd.nesterov = absl::GetFlag(FLAGS_nesterov);
  opt.schedule.step_size = absl::GetFlag(FLAGS_lr_decay_every);
  opt.schedule.gamma = static_cast<float>(absl::GetFlag(FLAGS_lr_decay_gamma));
  PS_ASSIGN_OR_RETURN(opt.schedule.unit, ParseLrScheduleUnit(absl::GetFlag(FLAGS_lr_decay_unit)));
  if (opt.schedule.unit == LrSchedule::Unit::kEpochs) {
    opt.schedule.steps_per_epoch = absl::GetFlag(FLAGS_steps_per_epoch);
    if (opt.schedule.step_size > 0 && opt.schedule.steps_per_epoch < 1) {
      return absl::InvalidArgumentError(
          "--lr_decay_unit=epochs with --lr_decay_every needs --steps_per_epoch");
    }
  }
  PS_ASSIGN_OR_RETURN(std::unique_ptr<ParameterServer> server,
                      ParameterServer::Create(options, model->parameters(), std::move(initial),
                                              &device));

  ParameterServerService service(server.get());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(
      absl::StrCat(absl::GetFlag(FLAGS_bind_address), ":", absl::GetFlag(FLAGS_port)),
      grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> grpc_server = builder.BuildAndStart();
  if (grpc_server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ",
                                               absl::GetFlag(FLAGS_bind_address), ":",
                                               absl::GetFlag(FLAGS_port)));
  }
  grpc_server->GetHealthCheckService()->SetServingStatus(true);
  const std::string advertised = absl::GetFlag(FLAGS_advertise_address).empty()
                                     ? absl::StrCat(absl::GetFlag(FLAGS_bind_address), ":", port)
                                     : absl::GetFlag(FLAGS_advertise_address);
  std::printf("parameter server serving %s (%lld parameters, %d workers) at %s\n",
              config.name.c_str(), static_cast<long long>(server->num_parameters()),
              options.num_workers, advertised.c_str());
  std::fflush(stdout);
  if (!absl::GetFlag(FLAGS_port_file).empty()) {
    FILE* f = std::fopen(absl::GetFlag(FLAGS_port_file).c_str(), "w");
    if (f == nullptr) return absl::UnavailableError("cannot write --port_file");
    std::fprintf(f, "%d\n", port);
    std::fclose(f);
  }

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  std::printf("parameter server stopping at version %lld\n",
              static_cast<long long>(server->version()));
  grpc_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return absl::OkStatus();
}

}  // namespace
}  // namespace ps::server

int main(int argc, char** argv) {
  ps::TuneMallocForLargeMessages();
  absl::SetProgramUsageMessage("Synchronous parameter server. See README.md.");
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = ps::server::Main();
  if (!status.ok()) {
    std::fprintf(stderr, "server: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
