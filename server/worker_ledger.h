#ifndef PS_SERVER_WORKER_LEDGER_H_
#define PS_SERVER_WORKER_LEDGER_H_

// The workers as the server knows them: who holds each rank (its id and
// its session credential), when each was last heard from, and which
// chunks each has pushed of the iterations in flight, with the samples
// they cover. Not thread-safe: ParameterServer keeps it under its
// bookkeeping lock.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "server/job_progress.h"

namespace ps::server {

// What a registration shows of being the worker it names (Register's
// identity rule: docs/security.md, "Worker identity").
struct WorkerIdentity {
  // The caller vouches that the registration is the worker it names: a
  // client certificate that names it (mutual TLS), or a caller in this
  // process. It takes its id's rank at once, as a restarted worker does.
  bool vouched = true;
  // Otherwise the worker's secret (RegisterRequest.identity_proof; may be
  // empty), and how long after it was last heard a rank's holder is live.
  std::string proof;
  absl::Duration liveness_timeout = absl::Seconds(10);
};

// The payload (absl::Status::GetPayload) on CheckIdentity's refusal:
// waiting until the holder is lost ends it.
inline constexpr char kLiveWorkerPayload[] = "ps.server/live-worker";

class WorkerLedger {
 public:
  explicit WorkerLedger(int num_workers) : workers_(num_workers) {}

  int num_workers() const { return static_cast<int>(workers_.size()); }
  // Sizes the push records for `total_chunks` chunks and `window`
  // iterations in flight (iteration k in slot k % window), none pushed.
  void LayOut(int64_t total_chunks, int64_t window);

  // Registration. Whether a worker holds `rank` (false out of range), and
  // the ids holding each rank (empty: free).
  bool Held(int rank) const;
  // kNotFound "`what` unregistered worker rank R" unless a worker holds
  // `rank` (`what`: "push from", say).
  absl::Status CheckHeld(int rank, absl::string_view what) const;
  std::vector<std::string> ids() const;
  // Whether a registration naming `worker_id` with `identity` may take the
  // rank that id holds: yes when it holds none, the registration is
  // vouched for, its proof is the one the holder registered with (compared
  // in constant time; an empty one proves nothing), or the holder was not
  // heard within the liveness timeout (lost: a restart without proof waits
  // for this). kAlreadyExists otherwise, naming the id and how long ago it
  // was heard, with kLiveWorkerPayload.
  absl::Status CheckIdentity(const std::string& worker_id, const WorkerIdentity& identity,
                             int64_t now_ns) const;
  // Gives `rank` to `worker_id` with `session` as its credential and
  // `proof` (may be empty) as its identity secret. The same id registering
  // again with `carry` (version 0 exists) is a restarted process: what the
  // rank pushed of the iterations in flight is carried (Claim accepts it
  // again without its being summed twice).
  void Admit(int rank, const std::string& worker_id, std::string session, bool carry,
             int64_t now_ns, std::string proof = "");
  // kNotFound for a rank nobody holds; kPermissionDenied when `session` is
  // not the rank's credential (another worker's, or an earlier process's).
  absl::Status CheckSession(int rank, absl::string_view session) const;
  // A sign of life (a heartbeat; registering and claims count too).
  void Heard(int rank, int64_t now_ns);

  // Pushes (the rank held; `iteration` in flight). Which chunks the rank
  // has claimed of `iteration`, and the samples it claimed (-1: none yet).
  const std::vector<bool>& pushed(int rank, int64_t iteration) const;
  int64_t num_samples(int rank, int64_t iteration) const;
  // Claims `global_chunks` for the rank in `iteration`: -1 once all are
  // claimed, or the index of the first the rank already pushed (nothing
  // claimed then). Sets which were carried (claimed, not to be summed).
  int64_t Claim(int rank, int64_t iteration, int64_t num_samples,
                absl::Span<const int64_t> global_chunks, int64_t now_ns,
                std::vector<bool>* carried);
  // An asynchronous push: the rank was heard and pushed.
  void NotePush(int rank, int64_t now_ns);
  // The chunks the rank has neither pushed nor carried of `iteration`.
  std::vector<int64_t> Unpushed(int rank, int64_t iteration) const;
  // Iteration `iteration` is over: its slot is free for iteration + window.
  void EndIteration(int64_t iteration);
  // The `participating` ranks that have not pushed all of `iteration`.
  std::vector<int> RanksMissing(int64_t iteration, const std::vector<bool>& participating) const;
  // Each rank's part of the job's progress at `version` (rank, id, times,
  // chunks pushed, the iteration it is at); `dropped` is filled by the caller.
  std::vector<WorkerProgress> Progress(int64_t version) const;

 private:
  // One worker's pushes of one iteration in flight.
  struct Pushes {
    std::vector<bool> pushed;   // per global chunk: claimed (its sum may be under way)
    std::vector<bool> carried;  // per global chunk: pushed by a previous process
    int64_t chunks = 0;         // pushed or carried
    int64_t num_samples = -1;   // -1 before the first chunk
  };
  struct Worker {
    std::string id;
    std::string session;  // the last registration's credential
    std::string proof;    // the last registration's identity secret ("": none)
    int64_t heard_ns = -1;
    int64_t last_push_iteration = -1;
    int64_t last_push_ns = -1;
    std::vector<Pushes> slots;  // iteration k's in slots[k % window_]
  };
  const Pushes& SlotOf(int rank, int64_t iteration) const {
    return workers_[rank].slots[iteration % window_];
  }

  std::vector<Worker> workers_;
  int64_t window_ = 1;
  int64_t total_chunks_ = 0;
};

}  // namespace ps::server

#endif  // PS_SERVER_WORKER_LEDGER_H_
