#ifndef PS_SERVER_PACED_REPLIES_H_
#define PS_SERVER_PACED_REPLIES_H_

#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/push_pacer.h"

namespace ps::server {

// The replies to accepted pushes that the pacer (server/push_pacer.h says
// why, and why holding cannot deadlock) holds back, each sent when the
// pacer lets it go, at its hold limit, or at Shutdown. The policy is
// PushPacer's; this class only keeps the held replies and the thread that
// sends the late ones, and knows nothing of gRPC: a reply is a callback.
//
// Thread-safe. A reply callback runs exactly once, never under this
// class's lock, on the thread of the call that lets it go (PaceOrAnswer,
// AnswerDue, Shutdown) or on the hold-limit thread.
class PacedReplies {
 public:
  // Sends one held reply (a gRPC push's: Finish(OK)).
  using Reply = std::function<void()>;

  // An accepted push, as the pacer counts it.
  struct Push {
    int rank = 0;
    int64_t iteration = 0;
    int64_t elements = 0;      // pushed by this call
    std::vector<int> members;  // the iteration's ranks, ascending
  };

  // With `answer_when_due` (and options.max_lead_elements > 0), a thread
  // sends each held reply once it falls due (the pacer's TakeDue, on the
  // real clock); without, only AnswerDue does (tests drive time by hand).
  explicit PacedReplies(PushPacer::Options options, bool answer_when_due = true);
  // Calls Shutdown().
  ~PacedReplies();
  PacedReplies(const PacedReplies&) = delete;
  PacedReplies& operator=(const PacedReplies&) = delete;

  // Records `push` at `now` with the pacer (whose iteration size becomes
  // `elements_per_iteration` if not known yet: a service may start before
  // the model is known) and either holds `reply` or sends it now; then
  // sends the held replies this record lets go. After Shutdown every reply
  // goes at once. Returns whether `reply` was held.
  bool PaceOrAnswer(const Push& push, int64_t elements_per_iteration, absl::Time now, Reply reply);

  // Sends the held replies due by `now`; returns how many.
  int64_t AnswerDue(absl::Time now);

  // Sends every held reply and stops the thread; from now on PaceOrAnswer
  // holds nothing. Idempotent; returns once the thread has stopped.
  void Shutdown();

  // Replies held now.
  int64_t held() const;

 private:
  // Takes the replies of the pacer's `tickets` out of held_.
  std::vector<Reply> TakeLocked(const std::vector<PushPacer::Ticket>& tickets)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void Send(std::vector<Reply> replies);
  // The thread's loop: sleeps until the nearest due time (or a first
  // hold, or Shutdown) and sends what is due.
  void AnswerWhenDue();

  mutable absl::Mutex mu_;
  PushPacer pacer_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<PushPacer::Ticket, Reply> held_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar changed_;  // closed, or a first reply held
  absl::Mutex thread_mu_;  // serializes Shutdown's join
  std::thread thread_ ABSL_GUARDED_BY(thread_mu_);
};

}  // namespace ps::server

#endif  // PS_SERVER_PACED_REPLIES_H_
