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
#include "common/clock.h"
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
  // The job run the state belongs to at the time of a write (proto
  // RegisterReply.job_run), recorded as job[kJobRunSetting] when not
  // empty. May be empty.
  std::function<std::string()> job_run;
  // Told one line per checkpoint written or failed. May be empty.
  std::function<void(const std::string&)> log;
  // What `every`, WriteFinal's timeout and the times reported are measured
  // on; must outlive the checkpointer. Null: the real one.
  const Clock* clock = Clock::Real();
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
// By steps alone (every_steps, no `every`) version 0 is written too (when
// the directory has no checkpoint yet), and the capture of each multiple is
// filed before the server gets there (the first when version 0 exists,
// each next one by the push that serves the previous), so it is taken at
// that version exactly (ParameterServer::CaptureState with a version: the update past it
// waits for the copy), however late this thread runs, and the shards of a
// sharded job, started alike, checkpoint at the same versions: a lost
// shard's checkpoint is one every other shard has too (docs/sharding.md).
// A write that fails is not retried; the next multiple is. A capture taken
// past its multiple (filed too late) is not written. At most two captures
// wait for the thread (each holds a copy of the state once served): with
// writes slower than the steps, the thread files the next multiple itself
// when it catches up.
//
// Time: `every` and WriteFinal's timeout are measured on options.clock,
// so a test drives them with a FakeClock. By time alone (every_steps 0) the
// thread sleeps on the clock until `every` has passed since the last write
// (or failure), then waits for the version to move past it. With
// every_steps it waits on the server's version instead, looking at the
// clock for `every` whenever that wait ends. Stop wakes the thread at once
// while it sleeps on the clock or waits for a capture; while it waits on
// the server's version, within 200 ms of real time (ParameterServer::
// WaitForVersion takes a wall-clock deadline and nothing else wakes it).
//
// One thread calls WriteFinal and Stop; last_version and the times of the
// last write may be read from any thread.
class Checkpointer {
 public:
  // `server` must outlive the checkpointer; `last_version` is the version
  // of the newest checkpoint already in the directory (-1: none).
  Checkpointer(ParameterServer* server, CheckpointerOptions options, int64_t last_version);
  // Stops the thread (a write under way finishes first).
  ~Checkpointer();

  // Stops the background thread, then writes the state at the next version
  // boundary (at once between iterations), waiting for it for `timeout` of
  // options.clock (infinite: as long as it takes): kDeadlineExceeded,
  // writing nothing, when the iteration in progress has applied part of its
  // update and does not complete by then (its state is neither version's).
  // OK without writing when the newest checkpoint is already of the current
  // version.
  absl::Status WriteFinal(absl::Duration timeout);
  // Stops the background thread (a write under way finishes first, and
  // the captures already taken are written; a capture it waits for is given
  // up). Idempotent.
  void Stop();

  // The newest version written (or given at construction), -1 for none.
  int64_t last_version() const;
  // How long ago, on options.clock, that version was written (since
  // construction until the first write).
  absl::Duration time_since_last_write() const;

 private:
  // A capture request's answer, shared with the server's push thread that
  // may serve it after the checkpointer has given up waiting.
  struct CaptureSlot;

  void Loop();
  // Sleeps on the clock until it reads `deadline_ns` or Stop is called
  // (false).
  bool SleepUntilOrStop(int64_t deadline_ns);
  // Captures the state at the next boundary (waiting until the clock reads
  // `deadline_ns`; a background capture also until Stop: kCancelled) and
  // writes it.
  absl::Status CaptureAndWrite(int64_t deadline_ns, bool background);
  // CaptureAndWrite's steps: a capture request (a background one is what
  // Stop cancels), waiting for it, and the write.
  std::shared_ptr<CaptureSlot> FileCapture(bool background);
  absl::StatusOr<ParameterServer::State> AwaitCapture(const std::shared_ptr<CaptureSlot>& slot,
                                                       int64_t deadline_ns);
  absl::Status Write(ParameterServer::State state);
  // Loop's by-steps-alone form: the capture of each multiple filed ahead
  // (FileChained).
  struct Chain;
  static void FileChained(const std::shared_ptr<Chain>& chain, int64_t at);
  void StepLoop();
  void Log(const std::string& line) const;

  ParameterServer* const server_;
  const CheckpointerOptions options_;
  const Clock* const clock_;  // options_.clock, never null
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t last_version_ ABSL_GUARDED_BY(mu_);
  // The newest version a background write failed at (-1: none).
  int64_t failed_version_ ABSL_GUARDED_BY(mu_) = -1;
  // The clock's reading at the last write or failure (construction before).
  int64_t last_time_ns_ ABSL_GUARDED_BY(mu_);
  // The background capture being waited for, which Stop gives up.
  std::shared_ptr<CaptureSlot> capture_ ABSL_GUARDED_BY(mu_);
  const std::shared_ptr<Chain> chain_;
  std::thread thread_;
};

// The job settings a checkpoint records and a resumed server must share:
// the worker count, the consistency mode, the optimizer and its settings
// (a learning rate that differs would not continue the same training;
// --optimizer=none has none). Keys are the flags' names.
std::map<std::string, std::string> JobSettings(const ParameterServerOptions& options);
// The key of the job run in a checkpoint's job settings: which run the state
// belongs to, not a setting, so JobDifferences leaves it out.
inline constexpr char kJobRunSetting[] = "job_run";
// "" when `saved` (from a checkpoint) and `current` agree, else the
// differences, e.g. "lr 0.9 in the checkpoint, 0.5 now", or only the
// optimizer's when it differs ("optimizer sgd in the checkpoint, none
// now"). A checkpoint without "optimizer" (written before it was recorded)
// is of "sgd". kJobRunSetting is not compared.
std::string JobDifferences(const std::map<std::string, std::string>& saved,
                           const std::map<std::string, std::string>& current);

}  // namespace ps::server

#endif  // PS_SERVER_CHECKPOINTER_H_
