#include "server/worker_ledger.h"

#include <algorithm>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "server/sessions.h"

namespace ps::server {

void WorkerLedger::LayOut(int64_t total_chunks, int64_t window) {
  total_chunks_ = total_chunks;
  window_ = window;
  for (Worker& w : workers_) {
    w.slots.assign(window_, Pushes());
    for (Pushes& pushes : w.slots) {
      pushes.pushed.assign(total_chunks, false);
      pushes.carried.assign(total_chunks, false);
    }
  }
}

bool WorkerLedger::Held(int rank) const {
  return rank >= 0 && rank < num_workers() && !workers_[rank].id.empty();
}

absl::Status WorkerLedger::CheckHeld(int rank, absl::string_view what) const {
  if (Held(rank)) return absl::OkStatus();
  return absl::NotFoundError(absl::StrCat(what, " unregistered worker rank ", rank));
}

std::vector<std::string> WorkerLedger::ids() const {
  std::vector<std::string> ids;
  for (const Worker& w : workers_) ids.push_back(w.id);
  return ids;
}

absl::Status WorkerLedger::CheckIdentity(const std::string& worker_id,
                                         const WorkerIdentity& identity, int64_t now_ns) const {
  if (identity.vouched) return absl::OkStatus();
  for (int rank = 0; rank < num_workers(); ++rank) {
    const Worker& holder = workers_[rank];
    if (holder.id != worker_id) continue;
    if (!identity.proof.empty() && SessionIssuer::Matches(holder.proof, identity.proof)) {
      return absl::OkStatus();
    }
    const int64_t quiet_ns = now_ns - holder.heard_ns;
    if (holder.heard_ns < 0 || quiet_ns > absl::ToInt64Nanoseconds(identity.liveness_timeout)) {
      return absl::OkStatus();
    }
    absl::Status live = absl::AlreadyExistsError(absl::StrCat(
        "worker '", worker_id, "' is live: rank ", rank, "'s holder was heard ",
        absl::StrFormat("%.1f s", absl::ToDoubleSeconds(absl::Nanoseconds(quiet_ns))),
        " ago, within the liveness timeout of ", absl::FormatDuration(identity.liveness_timeout),
        ", and this registration ",
        identity.proof.empty() ? "carries no identity proof" : "carries another identity proof",
        holder.proof.empty() ? " (the holder registered without one)" : "",
        ": a restarted worker gets its rank back once the server declares the old process "
        "lost, or at once with the same --identity_file"));
    live.SetPayload(kLiveWorkerPayload, absl::Cord(worker_id));
    return live;
  }
  return absl::OkStatus();
}

void WorkerLedger::Admit(int rank, const std::string& worker_id, std::string session,
                         bool carry, int64_t now_ns, std::string proof) {
  Worker& worker = workers_[rank];
  if (worker.id == worker_id && carry) {
    for (Pushes& pushes : worker.slots) {
      for (size_t gc = 0; gc < pushes.pushed.size(); ++gc) {
        if (pushes.pushed[gc]) pushes.carried[gc] = true;
        pushes.pushed[gc] = false;
      }
    }
  }
  worker.id = worker_id;
  worker.session = std::move(session);
  worker.proof = std::move(proof);
  worker.heard_ns = now_ns;
}

absl::Status WorkerLedger::CheckSession(int rank, absl::string_view session) const {
  if (!Held(rank)) return absl::NotFoundError(absl::StrCat("no worker holds rank ", rank));
  if (!SessionIssuer::Matches(workers_[rank].session, session)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "the session credential is not rank ", rank, "'s (worker '", workers_[rank].id,
        "' registered it since, or it is another worker's)"));
  }
  return absl::OkStatus();
}

void WorkerLedger::Heard(int rank, int64_t now_ns) { workers_[rank].heard_ns = now_ns; }

const std::vector<bool>& WorkerLedger::pushed(int rank, int64_t iteration) const {
  return SlotOf(rank, iteration).pushed;
}

int64_t WorkerLedger::num_samples(int rank, int64_t iteration) const {
  return workers_[rank].slots.empty() ? -1 : SlotOf(rank, iteration).num_samples;
}

int64_t WorkerLedger::Claim(int rank, int64_t iteration, int64_t num_samples,
                            absl::Span<const int64_t> global_chunks, int64_t now_ns,
                            std::vector<bool>* carried) {
  Worker& worker = workers_[rank];
  Pushes& pushes = worker.slots[iteration % window_];
  for (size_t c = 0; c < global_chunks.size(); ++c) {
    if (pushes.pushed[global_chunks[c]]) return static_cast<int64_t>(c);
  }
  carried->assign(global_chunks.size(), false);
  for (size_t c = 0; c < global_chunks.size(); ++c) {
    const int64_t gc = global_chunks[c];
    pushes.pushed[gc] = true;
    if (pushes.carried[gc]) {
      pushes.carried[gc] = false;
      (*carried)[c] = true;
    } else {
      ++pushes.chunks;
    }
  }
  if (!global_chunks.empty()) pushes.num_samples = num_samples;
  worker.last_push_iteration = std::max(worker.last_push_iteration, iteration);
  NotePush(rank, now_ns);
  return -1;
}

void WorkerLedger::NotePush(int rank, int64_t now_ns) {
  workers_[rank].heard_ns = workers_[rank].last_push_ns = now_ns;
}

std::vector<int64_t> WorkerLedger::Unpushed(int rank, int64_t iteration) const {
  std::vector<int64_t> unpushed;
  const Pushes& pushes = SlotOf(rank, iteration);
  for (int64_t gc = 0; gc < total_chunks_; ++gc) {
    if (!pushes.pushed[gc] && !pushes.carried[gc]) unpushed.push_back(gc);
  }
  return unpushed;
}

void WorkerLedger::EndIteration(int64_t iteration) {
  for (Worker& w : workers_) {
    Pushes& pushes = w.slots[iteration % window_];
    std::fill(pushes.pushed.begin(), pushes.pushed.end(), false);
    std::fill(pushes.carried.begin(), pushes.carried.end(), false);
    pushes.chunks = 0;
    pushes.num_samples = -1;
  }
}

std::vector<int> WorkerLedger::RanksMissing(int64_t iteration,
                                            const std::vector<bool>& participating) const {
  std::vector<int> missing;
  for (int r = 0; r < num_workers(); ++r) {
    if (!participating[r]) continue;
    if (workers_[r].slots.empty() || SlotOf(r, iteration).chunks < total_chunks_) {
      missing.push_back(r);
    }
  }
  return missing;
}

std::vector<WorkerProgress> WorkerLedger::Progress(int64_t version) const {
  std::vector<WorkerProgress> progress;
  for (int r = 0; r < num_workers(); ++r) {
    const Worker& w = workers_[r];
    WorkerProgress wp;
    wp.rank = r;
    wp.id = w.id;
    wp.heard_ns = w.heard_ns;
    wp.last_push_iteration = w.last_push_iteration;
    wp.last_push_ns = w.last_push_ns;
    wp.next_iteration = version;
    if (!w.slots.empty()) {
      wp.pushed_chunks = SlotOf(r, version).chunks;
      while (wp.next_iteration < version + window_ &&
             SlotOf(r, wp.next_iteration).chunks >= total_chunks_) {
        ++wp.next_iteration;
      }
    }
    progress.push_back(std::move(wp));
  }
  return progress;
}

}  // namespace ps::server
