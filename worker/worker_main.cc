// The worker daemon. Without --server it trains on its own devices with SGD
// in process; with --server it is one worker of a synchronous
// parameter-server job: it states the model (the server knows none), sends
// the initial parameters when it has rank 0, and leaves the optimizer to the
// server. --server may list several shards (host:port,host:port,...): the
// worker then cuts the model over them (worker/shard_plan.h) and talks to
// every shard concurrently.
//
//   bazel run -c opt //worker:worker -- --model=lenet --epochs=10
//
// main() parses the flags (worker_flags.h) and takes SIGINT/SIGTERM;
// RunWorker (run_worker.h) is the daemon.

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <thread>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "common/process_tuning.h"
#include "common/status_macros.h"
#include "worker/run_worker.h"
#include "worker/worker_flags.h"

namespace {

// SIGTERM and SIGINT never run a handler in this process (BlockStopSignals
// says why: our GEMMs are oneDNN's): main() blocks both before any thread
// exists and one thread takes them with sigwait. Until training starts a
// signal ends the process at once (128 + signal); then the first asks the
// trainer to stop after the step in progress and a second ends it at once.
void TakeStopSignals(const sigset_t& stop_signals, ps::worker::StopRequest* stop) {
  std::thread([stop_signals, stop] {
    for (;;) {
      int signal_number = 0;
      if (sigwait(&stop_signals, &signal_number) != 0) continue;
      if (stop->Request()) continue;
      // What is buffered is written, unless another thread holds the stream
      // (blocked writing to a pipe nobody reads): the exit never waits on it.
      for (FILE* stream : {stdout, stderr}) {
        if (ftrylockfile(stream) != 0) continue;
        fflush_unlocked(stream);
        funlockfile(stream);
      }
      _exit(128 + signal_number);
    }
  }).detach();
}

absl::Status Main(int argc, char** argv, ps::worker::StopRequest* stop) {
  PS_ASSIGN_OR_RETURN(const ps::worker::WorkerOptions options,
                      ps::worker::WorkerOptionsFromFlags(argc, argv));
  return ps::worker::RunWorker(options, stop);
}

}  // namespace

int main(int argc, char** argv) {
  // First: before any other thread exists. Never destroyed (see _exit below),
  // so the signal thread may use it to the end.
  static ps::worker::StopRequest stop;
  TakeStopSignals(ps::BlockStopSignals(), &stop);
  ps::TuneMallocForLargeMessages();
  ps::DisableMutexDeadlockDetection();
  absl::SetProgramUsageMessage("Data-parallel training worker. See README.md.");
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = Main(argc, argv, &stop);
  if (!status.ok()) std::fprintf(stderr, "worker: %s\n", status.ToString().c_str());
  // Stopped by SIGTERM before the end: the conventional 128 + 15, so a
  // restart policy that restarts failures brings it back to rejoin. Also
  // when the server was lost as it stopped (kCancelled: the trainer did not
  // wait for it to come back; the message says where it stopped).
  const bool stopped = stop.requested() && (status.ok() || absl::IsCancelled(status));
  const int code = stopped ? 128 + SIGTERM : !status.ok() ? 1 : 0;
  // Without running static destructors: gRPC's threads may still be
  // reconnecting a channel the store has let go of (a refused TLS
  // handshake retries), and OpenSSL torn down under them crashed the
  // process after its last line. Everything is written and closed by now.
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(code);
}
