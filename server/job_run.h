#ifndef PS_SERVER_JOB_RUN_H_
#define PS_SERVER_JOB_RUN_H_

// Which run of a job a server's state belongs to (proto RegisterReply.
// job_run): an opaque id a sharded job's rank 0 makes up when it first
// registers, adopted by every shard, recorded in every checkpoint and
// restored with it. A shard that comes back with another run's checkpoint
// directory then answers another id, and the workers refuse it by name
// instead of mixing two runs' parameters.

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ps::server {

// Thread-safe; the id never changes once set, except by Reset (a restore
// from a checkpoint, which recorded the run it belongs to).
class JobRun {
 public:
  explicit JobRun(std::string id = "") : id_(std::move(id)) {}

  // Adopts `proposed` when there is no id yet and it is not empty; returns
  // the id held afterwards (this one or an earlier one).
  std::string Adopt(const std::string& proposed) {
    absl::MutexLock lock(&mu_);
    if (id_.empty()) id_ = proposed;
    return id_;
  }
  std::string id() const {
    absl::MutexLock lock(&mu_);
    return id_;
  }
  // A checkpoint's run, when it recorded one (empty: kept as it is).
  void Reset(const std::string& id) {
    absl::MutexLock lock(&mu_);
    if (!id.empty()) id_ = id;
  }

 private:
  mutable absl::Mutex mu_;
  std::string id_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps::server

#endif  // PS_SERVER_JOB_RUN_H_
