#ifndef PS_WORKER_RUN_WORKER_H_
#define PS_WORKER_RUN_WORKER_H_

// The worker daemon as a library: RunWorker trains as its options say, alone
// or as one worker of a parameter-server job, so main() only parses flags
// and forwards signals, and a test or an embedder can run a whole worker in
// process.

#include <atomic>

#include "absl/status/status.h"
#include "worker/worker_options.h"

namespace ps::worker {

// A request to stop training, made from any thread (main's signal-waiting
// thread). Only a running training loop can stop cleanly: before
// registration there is nothing to finish, and a second request asks for
// more than a clean stop, so Request says whether it was taken and the
// caller ends the process itself when it was not. Thread-safe.
class StopRequest {
 public:
  // Asks the trainer to stop after the step in progress, its push and pull
  // complete (it asks after every step), and a store waiting for a lost
  // server to stop waiting. True when taken; false before TrainingStarted
  // and for every request after the first taken one.
  bool Request();
  // Whether a Request was taken.
  bool requested() const { return requested_.load(); }
  // RunWorker calls it once registered: from here a Request is taken.
  void TrainingStarted() { training_started_.store(true); }

 private:
  std::atomic<bool> training_started_{false};
  std::atomic<bool> requested_{false};
};

// Trains as `options` says: creates the devices, loads the data, and either
// checks the servers (options.check: prints each check, FailedPrecondition
// when one fails) or trains (alone, or registered with options.servers),
// printing its progress, each epoch and a summary on stdout, until the end
// or a `stop` request taken after a step. Then writes the weights, the
// report and the trace the options ask for (the trace also after a failed
// run). Errors: the setup's (kInvalidArgument for a bad dataset, device or
// model, the store's for servers it cannot reach or that refuse it), the
// trainer's, kCancelled when asked to stop while a lost server was not back
// (the message says which step did not complete), kUnavailable for a
// report it cannot write. `stop` must outlive the call; never null.
absl::Status RunWorker(const WorkerOptions& options, StopRequest* stop);

}  // namespace ps::worker

#endif  // PS_WORKER_RUN_WORKER_H_
