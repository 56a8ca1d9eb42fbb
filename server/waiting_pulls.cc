#include "server/waiting_pulls.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace ps::server {

absl::Time WaitDeadline(absl::Time now, int64_t timeout_ms, absl::Time call_deadline) {
  const int64_t ms = std::clamp<int64_t>(timeout_ms, 0, kMaxWaitMs);
  return std::min(now + absl::Milliseconds(ms), call_deadline);
}

WaitingPulls::WaitingPulls(const PullReadiness* readiness, Options options)
    : readiness_(readiness), max_pulls_(options.max_pulls) {
  absl::MutexLock lock(&thread_mu_);
  if (options.answer_at_deadlines) {
    deadline_thread_ = std::thread([this] { AnswerAtDeadlines(); });
  }
}

WaitingPulls::~WaitingPulls() { Close(absl::UnavailableError("server shutting down")); }

void WaitingPulls::File(WaitingPull* pull) {
  absl::Status refused;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) {
      refused = absl::UnavailableError("server shutting down");
    } else if (static_cast<int64_t>(pulls_.size()) >= max_pulls_) {
      refused = absl::ResourceExhaustedError(absl::StrCat(
          pulls_.size(), " pulls already wait for their chunks, the most this server "
          "lets wait (max_waiting_pulls = ", max_pulls_, "); try again later"));
    } else if (const std::optional<Watch> watch = FirstMissing(*pull); watch.has_value()) {
      const uint64_t seq = next_seq_++;
      if (by_deadline_.empty() || pull->deadline() < by_deadline_.begin()->first) {
        deadline_changed_.Signal();
      }
      pulls_[seq] = {pull, *watch};
      seq_of_[pull] = seq;
      by_chunk_[*watch].insert(seq);
      by_deadline_.emplace(pull->deadline(), seq);
      return;
    }
  }
  if (!refused.ok()) {
    pull->Refuse(refused);
  } else {
    pull->AnswerNow();  // its chunks came meanwhile
  }
}

void WaitingPulls::AnswerReady(absl::Span<const ChunkId> sent) {
  // Updates a state capture held back may have been published since the
  // last look (by this call or another, or by a cancelled capture): then
  // any waiting pull may be ready, whatever chunks this call sent.
  const int64_t releases = readiness_->held_back_releases();
  const bool every = releases != releases_seen_.exchange(releases);
  std::vector<WaitingPull*> ready;
  {
    absl::MutexLock lock(&mu_);
    if (pulls_.empty()) return;
    std::vector<uint64_t> candidates;
    auto add = [&](const Watch& watch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      auto it = by_chunk_.find(watch);
      if (it != by_chunk_.end()) {
        candidates.insert(candidates.end(), it->second.begin(), it->second.end());
      }
    };
    if (every) {
      for (const auto& [seq, entry] : pulls_) candidates.push_back(seq);
    } else {
      for (const ChunkId& id : sent) add({id.key, id.chunk});
      add(kAnyChunk);
    }
    for (const uint64_t seq : candidates) {
      auto it = pulls_.find(seq);
      if (it == pulls_.end()) continue;
      Entry& entry = it->second;
      const std::optional<Watch> watch = FirstMissing(*entry.pull);
      if (!watch.has_value()) {
        ready.push_back(entry.pull);
        EraseLocked(seq);
      } else if (*watch != entry.watch) {
        // Filed under the next chunk it waits for.
        Unwatch(seq, entry.watch);
        entry.watch = *watch;
        by_chunk_[*watch].insert(seq);
      }
    }
  }
  for (WaitingPull* pull : ready) pull->AnswerNow();
}

int64_t WaitingPulls::AnswerDue(absl::Time now) {
  std::vector<WaitingPull*> due;
  {
    absl::MutexLock lock(&mu_);
    due = TakeDueLocked(now);
  }
  // Past its deadline, a pull is answered at once: with its chunks if they
  // exist by now, else with the store's DEADLINE_EXCEEDED.
  for (WaitingPull* pull : due) pull->AnswerNow();
  return static_cast<int64_t>(due.size());
}

absl::Time WaitingPulls::next_deadline() const {
  absl::MutexLock lock(&mu_);
  return by_deadline_.empty() ? absl::InfiniteFuture() : by_deadline_.begin()->first;
}

bool WaitingPulls::Withdraw(WaitingPull* pull) {
  absl::MutexLock lock(&mu_);
  auto it = seq_of_.find(pull);
  if (it == seq_of_.end()) return false;
  EraseLocked(it->second);
  return true;
}

void WaitingPulls::Close(const absl::Status& status) {
  std::vector<WaitingPull*> all;
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    all.reserve(pulls_.size());
    for (const auto& [seq, entry] : pulls_) all.push_back(entry.pull);
    pulls_.clear();
    seq_of_.clear();
    by_chunk_.clear();
    by_deadline_.clear();
    deadline_changed_.SignalAll();
  }
  for (WaitingPull* pull : all) pull->Refuse(status);
  absl::MutexLock lock(&thread_mu_);
  if (deadline_thread_.joinable()) deadline_thread_.join();
}

int64_t WaitingPulls::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(pulls_.size());
}

std::optional<WaitingPulls::Watch> WaitingPulls::FirstMissing(const WaitingPull& pull) const {
  if (!readiness_->HasVersion(0)) return kAnyChunk;
  if (pull.ids().empty()) {
    if (readiness_->HasChunks(pull.version(), {})) return std::nullopt;
    return kAnyChunk;
  }
  for (const ChunkId& id : pull.ids()) {
    if (!readiness_->HasChunks(pull.version(), absl::MakeConstSpan(&id, 1))) {
      return Watch{id.key, id.chunk};
    }
  }
  return std::nullopt;
}

std::vector<WaitingPull*> WaitingPulls::TakeDueLocked(absl::Time now) {
  std::vector<WaitingPull*> due;
  while (!by_deadline_.empty() && by_deadline_.begin()->first <= now) {
    const uint64_t seq = by_deadline_.begin()->second;
    due.push_back(pulls_.at(seq).pull);
    EraseLocked(seq);
  }
  return due;
}

void WaitingPulls::Unwatch(uint64_t seq, const Watch& watch) {
  auto it = by_chunk_.find(watch);
  it->second.erase(seq);
  if (it->second.empty()) by_chunk_.erase(it);
}

void WaitingPulls::EraseLocked(uint64_t seq) {
  auto it = pulls_.find(seq);
  Unwatch(seq, it->second.watch);
  by_deadline_.erase({it->second.pull->deadline(), seq});
  seq_of_.erase(it->second.pull);
  pulls_.erase(it);
}

void WaitingPulls::AnswerAtDeadlines() {
  for (;;) {
    std::vector<WaitingPull*> due;
    {
      absl::MutexLock lock(&mu_);
      if (closed_) return;
      const absl::Time now = absl::Now();
      due = TakeDueLocked(now);
      if (due.empty()) {
        deadline_changed_.WaitWithDeadline(
            &mu_, by_deadline_.empty() ? absl::InfiniteFuture() : by_deadline_.begin()->first);
        continue;
      }
    }
    for (WaitingPull* pull : due) pull->AnswerNow();
  }
}

}  // namespace ps::server
