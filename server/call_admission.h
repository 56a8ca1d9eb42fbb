#ifndef PS_SERVER_CALL_ADMISSION_H_
#define PS_SERVER_CALL_ADMISSION_H_

// Whether the service lets a call in, before it reads the request: not once
// the server is stopping (UNAVAILABLE, which workers take as a reason to
// reconnect) or the job has failed (the failure, which they do not), and
// only with the job's token when there is one (UNAUTHENTICATED). The gRPC
// service asks it first on every call. Thread-safe.

#include <atomic>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace ps::server {

class CallAdmission {
 public:
  // `job_token` (common/job_token.h): every call must carry it; empty: none.
  explicit CallAdmission(std::string job_token) : job_token_(std::move(job_token)) {}

  // OK, or why the call must be refused: a call carrying `token` (the
  // call's job-token metadata, "" when absent).
  absl::Status Admit(absl::string_view token) const;

  // From now on every call is refused UNAVAILABLE "server shutting down:
  // <reason>". Idempotent: the first reason stays.
  void Stop(const std::string& reason);
  // From now on every call is refused with `failure` (which must not be a
  // code workers reconnect on). Returns false, changing nothing, when the
  // job has failed already (the first failure stays).
  bool Fail(const absl::Status& failure);

 private:
  const std::string job_token_;
  mutable absl::Mutex mu_;
  std::string stop_reason_ ABSL_GUARDED_BY(mu_);  // non-empty once stopping
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  // Set with either; read first so that a serving server takes no lock.
  std::atomic<bool> stopping_{false};
};

}  // namespace ps::server

#endif  // PS_SERVER_CALL_ADMISSION_H_
