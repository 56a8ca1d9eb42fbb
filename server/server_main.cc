// The parameter-server daemon: holds named tensors and an optimizer, nothing
// of a model. It sums the pushes of --num_workers workers each iteration,
// applies SGD and serves the new version (with --optimizer=none it serves
// their mean gradient instead, for workers with an optimizer of their own). The workers state the model: the
// first to register gives the signature, rank 0 the initial parameters
// (unless --init_weights gives them), and all the steps per epoch.
//
//   bazel run -c opt //server:server -- --num_workers=2 --lr=0.9
//
// main() parses the flags (server_flags.h) and forwards SIGINT/SIGTERM;
// RunServer (run_server.h) is the daemon.

#include <signal.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "common/process_tuning.h"
#include "common/status_macros.h"
#include "server/run_server.h"
#include "server/server_flags.h"

namespace {

absl::Status Main(int argc, char** argv) {
  PS_ASSIGN_OR_RETURN(const ps::server::ServerOptions options,
                      ps::server::ServerOptionsFromFlags(argc, argv));
  // SIGINT/SIGTERM are blocked in every thread (gRPC's inherit the mask)
  // and taken synchronously by one thread, which asks the server to stop.
  const sigset_t stop_signals = ps::BlockStopSignals();
  ps::server::StopRequest stop;
  std::thread([stop_signals, &stop] {
    int signal_number = 0;
    sigwait(&stop_signals, &signal_number);
    stop.Request(absl::StrCat("received ", strsignal(signal_number)));
  }).detach();
  return ps::server::RunServer(options, &stop);
}

}  // namespace

int main(int argc, char** argv) {
  ps::TuneMallocForLargeMessages();
  ps::DisableMutexDeadlockDetection();
  absl::SetProgramUsageMessage("Synchronous parameter server. See README.md.");
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = Main(argc, argv);
  if (!status.ok()) {
    std::fprintf(stderr, "server: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
