#ifndef PS_SERVER_CHECKPOINTER_H_
#define PS_SERVER_CHECKPOINTER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/checkpoint.h"
#include "server/parameter_server.h"

namespace ps::server {

struct CheckpointerOptions {
  CheckpointOptions files;  // directory and how many to keep
  // A checkpoint at every version that is a multiple of this (0: not by
  // steps) ...
  int64_t every_steps = 0;
  // ... and/or once this long has passed since the last one and the
  // version has moved (zero: not by time).
  absl::Duration every = absl::ZeroDuration();
  // Written into every checkpoint (CheckpointContents::job).
  std::map<std::string, std::string> job;
  // Told one line per checkpoint written or failed. May be empty.
  std::function<void(const std::string&)> log;
};

// Writes a ParameterServer's checkpoints in the background: one thread that
// waits until a checkpoint is due, asks the server for its state at the
// next version boundary (ParameterServer::CaptureState: the copy is made by
// the push that ends the iteration, under the server's lock, a few
// milliseconds per 10M parameters) and writes it (server/checkpoint.h:
// safetensors + manifest, atomic, the last `keep` kept) while training goes
// on. A write that fails is reported and retried at the next due point (the
// next multiple of every_steps past the version it tried, or `every` later
// once the version has moved), never at once; training never waits for a
// write.
//
// One thread calls WriteFinal and Stop; last_version and last_write_time
// may be read from any thread.
class Checkpointer {
 public:
  // `server` must outlive the checkpointer; `last_version` is the version
  // of the newest checkpoint already in the directory (-1: none).
  Checkpointer(ParameterServer* server, CheckpointerOptions options, int64_t last_version);
  // Stops the thread (a write under way finishes first).
  ~Checkpointer();

  // Stops the background thread, then writes the state at the next version
  // boundary (at once between iterations), waiting for it until `deadline`:
  // kDeadlineExceeded, writing nothing, when the iteration in progress has
  // applied part of its update and does not complete by then (its state is
  // neither version's). OK without writing when the newest checkpoint is
  // already of the current version.
  absl::Status WriteFinal(absl::Time deadline);
  void Stop();

  // The newest version written (or given at construction), -1 for none, and
  // when it was written (construction time until the first write).
  int64_t last_version() const;
  absl::Time last_write_time() const;

 private:
  void Loop();
  // Captures the state at the next boundary (waiting until `deadline`, or
  // until Stop) and writes it.
  absl::Status CaptureAndWrite(absl::Time deadline);
  void Log(const std::string& line) const;

  ParameterServer* const server_;
  const CheckpointerOptions options_;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t last_version_ ABSL_GUARDED_BY(mu_);
  // The newest version a background write failed at (-1: none).
  int64_t failed_version_ ABSL_GUARDED_BY(mu_) = -1;
  absl::Time last_time_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// The job settings a checkpoint records and a resumed server must share:
// the worker count, the consistency mode and the optimizer's (a learning
// rate that differs would not continue the same training). Keys are the
// flags' names.
std::map<std::string, std::string> JobSettings(const ParameterServerOptions& options);
// "" when `saved` (from a checkpoint) and `current` agree, else the
// differences, e.g. "lr 0.9 in the checkpoint, 0.5 now".
std::string JobDifferences(const std::map<std::string, std::string>& saved,
                           const std::map<std::string, std::string>& current);

}  // namespace ps::server

#endif  // PS_SERVER_CHECKPOINTER_H_
