#ifndef PS_SERVER_RUN_SERVER_H_
#define PS_SERVER_RUN_SERVER_H_

// The parameter-server daemon as a library: RunServer serves one job until
// asked to stop, so main() only parses flags and forwards signals, and a
// test or an embedder can run a whole server in process.

#include <functional>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/server_options.h"

namespace ps::server {

// A request to stop, made once from any thread (a signal-waiting thread, or
// the job supervisor failing the job); later requests are ignored.
class StopRequest {
 public:
  // `reason` is said in the stop line and in every refused call, e.g.
  // "received Terminated".
  void Request(std::string reason);
  // Blocks until Request; returns its reason.
  std::string Wait();
  // Calls `on_request` with the reason once Request is called (at once if
  // it was), under the request's lock, instead of waking Wait only: for
  // RunServer, which waits on restores too. Replaces an earlier one; an
  // empty function removes it.
  void OnRequest(std::function<void(const std::string&)> on_request);

 private:
  absl::Mutex mu_;
  std::optional<std::string> reason_ ABSL_GUARDED_BY(mu_);
  std::function<void(const std::string&)> on_request_ ABSL_GUARDED_BY(mu_);
};

// Serves the job `options` describes: resumes from the newest checkpoint in
// options.checkpoint_dir (or starts from options.init_weights, or waits for
// worker rank 0's parameters), listens, supervises the workers and writes
// checkpoints until `stop` is requested or the job fails; then writes a
// final checkpoint at the next version boundary (within stop_timeout),
// refuses new calls, answers the waiting ones, writes the trace and
// returns. A worker's Restore to an older checkpoint (proto RestoreRequest,
// with a checkpoint directory only) ends the serving generation instead:
// no final checkpoint, every session dropped, the checkpoints newer than
// the one restored moved aside (server/checkpoint.h,
// SetAsideCheckpointsAfter), and serving starts again from it on the same
// port. Errors: the setup's (kInvalidArgument, kFailedPrecondition for
// plaintext off loopback without options.insecure or another job's
// checkpoint, kUnavailable for a port it cannot listen on), and
// kFailedPrecondition when the job failed (a worker lost under wait).
absl::Status RunServer(const ServerOptions& options, StopRequest* stop);

}  // namespace ps::server

#endif  // PS_SERVER_RUN_SERVER_H_
