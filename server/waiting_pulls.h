#ifndef PS_SERVER_WAITING_PULLS_H_
#define PS_SERVER_WAITING_PULLS_H_

#include <atomic>
#include <cstdint>
#include <optional>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "server/parameter_server.h"

namespace ps::server {

// Pulls that wait for chunk versions without pinning a thread (a Pull or
// Wait whose chunks do not exist yet), each answered exactly once:
//   - by AnswerReady, called by whoever made its chunks exist (a Push,
//     Initialize or Register call, once that call has finished);
//   - at its deadline, by AnswerDue: the deadline thread calls it on the
//     real clock (tests call it with the time they choose);
//   - when its client cancels it: Withdraw hands it back to the caller;
//   - by Close, with the status given (shutdown, a failed job).
// Pulls made ready by calls on the store directly, not through AnswerReady,
// are answered at their deadline. At most max_pulls wait at once.
//
// Thread-safe. No pull is answered under this class's lock; lock order:
// this class's lock, then the store's (PullReadiness calls).

// What the waiting pulls wait on: a store's chunk versions
// (ParameterServer's, through ServerReadiness). Thread-safe.
class PullReadiness {
 public:
  using ChunkId = ParameterServer::ChunkId;
  virtual ~PullReadiness() = default;
  // Whether version `version` of the whole store exists.
  virtual bool HasVersion(int64_t version) const = 0;
  // Whether a pull of `chunks` (none: the store's version) at `version`
  // would be answered without waiting. Chunk versions only grow: once true,
  // true for ever.
  virtual bool HasChunks(int64_t version, absl::Span<const ChunkId> chunks) const = 0;
  // A count that moves whenever chunks may have become ready other than by
  // the calls that say what they sent (ParameterServer::held_back_releases).
  virtual int64_t held_back_releases() const = 0;
};

// A ParameterServer as the waiting pulls see it; it must outlive this.
class ServerReadiness final : public PullReadiness {
 public:
  explicit ServerReadiness(const ParameterServer* server) : server_(server) {}
  bool HasVersion(int64_t version) const override { return server_->HasVersion(version); }
  bool HasChunks(int64_t version, absl::Span<const ChunkId> chunks) const override {
    return server_->HasChunks(version, chunks);
  }
  int64_t held_back_releases() const override { return server_->held_back_releases(); }

 private:
  const ParameterServer* const server_;
};

// One pull that waits: what it waits for, until when, and how it is
// answered. Whoever files it keeps it alive until it is answered (a gRPC
// reactor deletes itself once finished).
class WaitingPull {
 public:
  using ChunkId = ParameterServer::ChunkId;
  // `ids` empty: waits for the store's version `version`.
  WaitingPull(int64_t version, std::vector<ChunkId> ids, absl::Time deadline)
      : version_(version), ids_(std::move(ids)), deadline_(deadline) {}
  virtual ~WaitingPull() = default;

  int64_t version() const { return version_; }
  const std::vector<ChunkId>& ids() const { return ids_; }
  absl::Time deadline() const { return deadline_; }

  // Answers without waiting any more: with its chunks if they exist, else
  // (past its deadline) with the error the store gives at once.
  virtual void AnswerNow() = 0;
  // Answers with `status` (not OK).
  virtual void Refuse(const absl::Status& status) = 0;

 private:
  const int64_t version_;
  const std::vector<ChunkId> ids_;
  const absl::Time deadline_;
};

// When a pull asked at `now` to wait `timeout_ms` gives up: the timeout is
// clamped to [0, kMaxWaitMs] (so a hostile one cannot hold a pull's memory
// for ever), and never past `call_deadline`, the client's own (nobody would
// hear the answer).
inline constexpr int64_t kMaxWaitMs = 3600 * 1000;
absl::Time WaitDeadline(absl::Time now, int64_t timeout_ms, absl::Time call_deadline);

class WaitingPulls {
 public:
  using ChunkId = ParameterServer::ChunkId;
  struct Options {
    // RESOURCE_EXHAUSTED, naming the cap, beyond (ServiceOptions says why).
    int64_t max_pulls = 65536;
    // A thread answers each pull at its deadline on the real clock; without
    // it only AnswerDue does.
    bool answer_at_deadlines = true;
  };

  // `readiness` must outlive every call but Withdraw, and Close.
  WaitingPulls(const PullReadiness* readiness, Options options);
  // Close(UNAVAILABLE "server shutting down").
  ~WaitingPulls();
  WaitingPulls(const WaitingPulls&) = delete;
  WaitingPulls& operator=(const WaitingPulls&) = delete;

  // Files `pull` to wait, or answers it now: AnswerNow when it need not
  // wait (its chunks exist by now), Refuse with UNAVAILABLE "server
  // shutting down" once closed or RESOURCE_EXHAUSTED when max_pulls wait.
  void File(WaitingPull* pull);

  // Answers the pulls that a successful call sending `sent` (and perhaps
  // completing version 0 or the store's version) has made ready; every
  // ready pull when held_back_releases moved since the last look.
  void AnswerReady(absl::Span<const ChunkId> sent);

  // Answers every pull whose deadline is at or before `now`, nearest
  // first; returns how many.
  int64_t AnswerDue(absl::Time now);
  // The nearest deadline of a waiting pull (InfiniteFuture when none).
  absl::Time next_deadline() const;

  // Takes `pull` out if it still waits: true, and answering it is then the
  // caller's; false when it was answered (or is being answered) already.
  bool Withdraw(WaitingPull* pull);

  // Refuses every waiting pull with `status` and every later File, and
  // stops the deadline thread. Idempotent; returns once the thread has
  // stopped. Not to be called from an answer.
  void Close(const absl::Status& status);

  // Pulls waiting now.
  int64_t size() const;

 private:
  // A chunk (key, chunk index), or kAnyChunk.
  using Watch = std::pair<int, int64_t>;
  static constexpr Watch kAnyChunk{-1, -1};
  struct Entry {
    WaitingPull* pull = nullptr;
    Watch watch;
  };

  // The chunk `pull` should be filed under, or nothing once it need not
  // wait. Chunk versions only grow, so a chunk seen here at its version
  // stays there; one seen missing is completed by a call sending it, which
  // looks here after its store call, under mu_.
  std::optional<Watch> FirstMissing(const WaitingPull& pull) const;
  // Takes out the pulls whose deadline is at or before `now`.
  std::vector<WaitingPull*> TakeDueLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Unwatch(uint64_t seq, const Watch& watch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseLocked(uint64_t seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The deadline thread's loop: sleeps until the nearest deadline (woken
  // when a nearer one is filed) and answers what is due, until closed.
  void AnswerAtDeadlines();

  const PullReadiness* const readiness_;
  const int64_t max_pulls_;
  // held_back_releases at the last AnswerReady.
  std::atomic<int64_t> releases_seen_{0};
  mutable absl::Mutex mu_;
  absl::CondVar deadline_changed_;  // a nearer deadline filed, or closed
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  // Each pull filed under one chunk it still waits for (so a call that
  // sends chunks looks only at the pulls those chunks may complete) or,
  // while version 0 does not exist or for a pull of no chunks, under
  // kAnyChunk; and by deadline.
  absl::flat_hash_map<uint64_t, Entry> pulls_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<const WaitingPull*, uint64_t> seq_of_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<Watch, absl::flat_hash_set<uint64_t>> by_chunk_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<absl::Time, uint64_t>> by_deadline_ ABSL_GUARDED_BY(mu_);
  absl::Mutex thread_mu_;  // serializes Close's join
  std::thread deadline_thread_ ABSL_GUARDED_BY(thread_mu_);
};

}  // namespace ps::server

#endif  // PS_SERVER_WAITING_PULLS_H_
