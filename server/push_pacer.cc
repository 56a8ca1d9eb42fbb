#include "server/push_pacer.h"

#include <algorithm>
#include <limits>
#include <utility>

namespace ps::server {

PushPacer::PushPacer(Options options, int64_t elements_per_iteration)
    : options_(options), elements_per_iteration_(std::max<int64_t>(0, elements_per_iteration)) {}

void PushPacer::set_elements_per_iteration(int64_t elements_per_iteration) {
  if (elements_per_iteration_ == 0 && elements_per_iteration > 0) {
    elements_per_iteration_ = elements_per_iteration;
  }
}

int64_t PushPacer::ProgressOf(const Position& position) const {
  // Unknown (0), an iteration counts as one element: never the case for a
  // pacer used as documented, and no worse than counting within iterations.
  return position.iteration * std::max<int64_t>(1, elements_per_iteration_) + position.elements;
}

PushPacer::Slowest PushPacer::FindSlowest(int64_t iteration) const {
  Slowest slowest{std::numeric_limits<int64_t>::max(), absl::InfinitePast()};
  for (int member : members_) {
    auto it = positions_.find(member);
    const Position position = it == positions_.end() ? Position{iteration, 0} : it->second;
    const int64_t progress = ProgressOf(position);
    if (progress < slowest.progress) slowest = {progress, position.last_push};
  }
  return slowest;
}

template <typename Pred>
void PushPacer::TakeWhere(Pred take, std::vector<Ticket>* taken) {
  auto kept_end = std::stable_partition(held_.begin(), held_.end(),
                                        [&](const Held& held) { return !take(held); });
  for (auto it = kept_end; it != held_.end(); ++it) taken->push_back(it->ticket);
  held_.erase(kept_end, held_.end());
}

PushPacer::Decision PushPacer::Record(int rank, int64_t iteration, int64_t elements,
                                      absl::Span<const int> members, absl::Time now) {
  Decision decision;
  Position& position = positions_[rank];
  if (iteration > position.iteration) {
    position.iteration = iteration;
    position.elements = 0;
  }
  // A push of an iteration behind the rank's position (a late retry)
  // counts nowhere: the rank has moved on.
  if (iteration == position.iteration) position.elements += elements;
  position.last_push = now;
  const int64_t progress = ProgressOf(position);
  iteration_ = std::max(iteration_, iteration);
  if (!members.empty()) members_.assign(members.begin(), members.end());
  if (members_.empty()) return decision;
  const Slowest slowest = FindSlowest(iteration_);
  TakeWhere(
      [&](const Held& held) {
        return held.progress - slowest.progress <= options_.max_lead_elements;
      },
      &decision.released);
  const bool member = std::binary_search(members_.begin(), members_.end(), rank);
  const bool slowest_pushing = now - slowest.last_push < options_.idle_after;
  if (options_.max_lead_elements > 0 && member && slowest_pushing &&
      progress - slowest.progress > options_.max_lead_elements) {
    const Ticket ticket = next_ticket_++;
    held_.push_back({ticket, progress, now + options_.max_hold});
    decision.held = ticket;
  }
  return decision;
}

std::vector<PushPacer::Ticket> PushPacer::TakeDue(absl::Time now) {
  std::vector<Ticket> due;
  if (held_.empty()) return due;
  const bool slowest_idle = now - FindSlowest(iteration_).last_push >= options_.idle_after;
  TakeWhere([&](const Held& held) { return slowest_idle || held.due <= now; }, &due);
  return due;
}

absl::Time PushPacer::next_due() const {
  if (held_.empty()) return absl::InfiniteFuture();
  absl::Time next = FindSlowest(iteration_).last_push + options_.idle_after;
  for (const Held& held : held_) next = std::min(next, held.due);
  return next;
}

std::vector<PushPacer::Ticket> PushPacer::TakeAll() {
  std::vector<Ticket> all;
  TakeWhere([](const Held&) { return true; }, &all);
  return all;
}

}  // namespace ps::server
