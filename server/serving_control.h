#ifndef PS_SERVER_SERVING_CONTROL_H_
#define PS_SERVER_SERVING_CONTROL_H_

// What ends one serving generation of a server process (server/run_server.h):
// a stop, after which the process ends, or a worker's Restore to an older
// checkpoint (proto RestoreRequest), after which the process serves again
// from that checkpoint on the same port. The Restore handlers post their
// requests here and are answered once the serving loop has decided; the
// serving loop waits for either event. A pure mailbox: no gRPC, no files.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace ps::server {

// Thread-safe. Every `done` given to AskRestore runs exactly once: from
// Answer, or from Stop or Close (UNAVAILABLE) when the process stops or
// restarts first, or at once when it has stopped or is closed; never under
// the control's lock.
class ServingControl {
 public:
  using Done = std::function<void(absl::Status)>;

  // The process stops (the first reason is kept); pending restores are
  // answered UNAVAILABLE "server shutting down: <reason>".
  void Stop(std::string reason);

  // A restore to `version` (a Restore call past the service's checks):
  // queued for the serving loop, which runs `done` with its decision.
  void AskRestore(int64_t version, Done done);

  struct Event {
    std::optional<std::string> stop;  // set: stop, with its reason
    int64_t restore = -1;             // else: the version the oldest pending restore asks for
  };
  // Blocks until a stop or a pending restore; a stop comes first.
  Event Wait();

  // Answers every pending restore of `version` with `status`, and, when
  // `status` is OK (the process restarts from `version`), every other one
  // with UNAVAILABLE (its caller registers again and asks anew).
  void Answer(int64_t version, const absl::Status& status);

  // Between two generations (the old one's service is being torn down):
  // every pending restore, and every one asked until Reopen, is answered
  // UNAVAILABLE at once, so none outlives the service that took it.
  void Close();
  void Reopen();

 private:
  struct Pending {
    int64_t version;
    Done done;
  };
  absl::Mutex mu_;
  std::optional<std::string> stop_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Pending> pending_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps::server

#endif  // PS_SERVER_SERVING_CONTROL_H_
