#include "server/paced_replies.h"

#include <utility>

#include "absl/time/clock.h"

namespace ps::server {

PacedReplies::PacedReplies(PushPacer::Options options, bool answer_when_due)
    : pacer_(options, /*elements_per_iteration=*/0) {
  absl::MutexLock lock(&thread_mu_);
  if (answer_when_due && options.max_lead_elements > 0) {
    thread_ = std::thread([this] { AnswerWhenDue(); });
  }
}

PacedReplies::~PacedReplies() { Shutdown(); }

bool PacedReplies::PaceOrAnswer(const Push& push, int64_t elements_per_iteration, absl::Time now,
                                Reply reply) {
  std::vector<Reply> released;
  bool held = false;
  {
    absl::MutexLock lock(&mu_);
    if (!closed_) {
      pacer_.set_elements_per_iteration(elements_per_iteration);
      PushPacer::Decision decision =
          pacer_.Record(push.rank, push.iteration, push.elements, push.members, now);
      released = TakeLocked(decision.released);
      if (decision.held.has_value()) {
        // A hold falls due no earlier than those before it (max_hold after
        // it began, or the slowest rank's idle time, which its pushes only
        // move later), so only the first of a run of holds moves the
        // thread's deadline; one that a change of slowest rank brings
        // forward is met at most idle_after late.
        if (held_.empty()) changed_.Signal();
        held_[*decision.held] = std::move(reply);
        held = true;
      }
    }
  }
  if (!held) released.push_back(std::move(reply));
  Send(std::move(released));
  return held;
}

int64_t PacedReplies::AnswerDue(absl::Time now) {
  std::vector<Reply> due;
  {
    absl::MutexLock lock(&mu_);
    due = TakeLocked(pacer_.TakeDue(now));
  }
  const int64_t count = static_cast<int64_t>(due.size());
  Send(std::move(due));
  return count;
}

void PacedReplies::Shutdown() {
  std::vector<Reply> all;
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    changed_.Signal();
    all = TakeLocked(pacer_.TakeAll());
  }
  Send(std::move(all));
  absl::MutexLock lock(&thread_mu_);
  if (thread_.joinable()) thread_.join();
}

int64_t PacedReplies::held() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(held_.size());
}

std::vector<PacedReplies::Reply> PacedReplies::TakeLocked(
    const std::vector<PushPacer::Ticket>& tickets) {
  std::vector<Reply> replies;
  replies.reserve(tickets.size());
  for (PushPacer::Ticket ticket : tickets) {
    auto it = held_.find(ticket);
    replies.push_back(std::move(it->second));
    held_.erase(it);
  }
  return replies;
}

void PacedReplies::Send(std::vector<Reply> replies) {
  for (Reply& reply : replies) reply();
}

void PacedReplies::AnswerWhenDue() {
  for (;;) {
    std::vector<Reply> late;
    {
      absl::MutexLock lock(&mu_);
      if (closed_) return;
      const absl::Time due = pacer_.next_due();
      if (due == absl::InfiniteFuture()) {
        changed_.Wait(&mu_);
      } else {
        changed_.WaitWithDeadline(&mu_, due);
      }
      late = TakeLocked(pacer_.TakeDue(absl::Now()));
    }
    Send(std::move(late));
  }
}

}  // namespace ps::server
