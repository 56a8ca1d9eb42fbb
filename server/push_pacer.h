#ifndef PS_SERVER_PUSH_PACER_H_
#define PS_SERVER_PUSH_PACER_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace ps::server {

// Evens out how fast the members' pushes reach a shard in synchronous
// training. A chunk is updated (and can be pulled) only once every member
// has pushed it, so the bytes a worker pushes ahead of the slowest member
// wait, useless, for the slowest to catch up, while they take the shard's
// link from it: TCP shares a link by congestion windows, not by need, and
// through a shaped 1 Gbit/s link one worker's pushes often ran at twice the
// other's for most of a step, so updates, and the pulls behind them, moved
// at the slower worker's share and piled up at the step's end.
//
// The pacer holds the reply to a push that leaves its rank more than
// max_lead_elements ahead of the slowest member while the slowest is
// pushing. The worker's bound on bytes in flight (its pushes count until
// answered) then stops it sending, and the link goes to the rank behind;
// the held replies go once the slowest is within the lead again, or has
// pushed nothing for `idle_after` (it is computing, and the link would
// otherwise idle: pushing ahead then costs nobody anything). Progress
// counts elements (not bytes, so compressed pushes count what they cover):
// a rank at iteration t having pushed e elements of it is at
// t * elements_per_iteration + e.
//
// Why this cannot deadlock: the push itself was applied before its reply is
// held (holding changes when the worker hears of it, never the server's
// state); the slowest member's replies are never held, so it always keeps
// sending, and once it stops the others go on after idle_after. No reply
// waits longer than max_hold in any case.
//
// Thread-compatible: the caller serializes calls.
class PushPacer {
 public:
  struct Options {
    // 0: never hold (the pacer only keeps count).
    int64_t max_lead_elements = 0;
    // The slowest member is pushing while its last push came less than
    // this long ago.
    absl::Duration idle_after = absl::Milliseconds(20);
    // No reply waits longer than this.
    absl::Duration max_hold = absl::Seconds(1);
  };
  using Ticket = uint64_t;

  // `elements_per_iteration`: the elements of one whole push on this shard
  // (the model's, or this shard's part of it); 0 when not known yet, and
  // then set_elements_per_iteration before the first Record.
  PushPacer(Options options, int64_t elements_per_iteration);

  // For a pacer built before the model was known (a server whose first
  // worker registers after it starts): the first value > 0 given, here or
  // to the constructor, is the one used; later calls change nothing, so
  // every progress is counted in one unit.
  void set_elements_per_iteration(int64_t elements_per_iteration);

  struct Decision {
    // Set when this push's reply must wait: a later Record's `released`,
    // TakeDue or TakeAll hands the ticket back when it may go.
    std::optional<Ticket> held;
    // Earlier held replies that may go now (this push let the slowest catch
    // up, or made `members` known).
    std::vector<Ticket> released;
  };
  // Records that `rank` pushed `elements` elements of `iteration`, taking
  // part with `members` (the iteration's ranks, ascending; a member with no
  // push recorded yet counts as at the start of `iteration`). A rank not in
  // `members`, or an empty `members`, is never held.
  Decision Record(int rank, int64_t iteration, int64_t elements, absl::Span<const int> members,
                  absl::Time now);

  // The held replies that may go by `now`: the slowest member has been
  // idle for idle_after, or a reply's max_hold has passed.
  std::vector<Ticket> TakeDue(absl::Time now);
  // When TakeDue next may hand back a reply (InfiniteFuture when none is
  // held).
  absl::Time next_due() const;
  // Every held reply (at shutdown).
  std::vector<Ticket> TakeAll();
  int64_t held() const { return static_cast<int64_t>(held_.size()); }

 private:
  struct Position {
    int64_t iteration = 0;
    int64_t elements = 0;  // of `iteration`
    absl::Time last_push = absl::InfinitePast();
  };
  struct Held {
    Ticket ticket = 0;
    int64_t progress = 0;  // the rank's, just after the held push
    absl::Time due;
  };
  int64_t ProgressOf(const Position& position) const;
  struct Slowest {
    int64_t progress = 0;
    absl::Time last_push = absl::InfinitePast();
  };
  // The member least far on (the first such), one not heard from counting
  // as at the start of `iteration` and idle.
  Slowest FindSlowest(int64_t iteration) const;
  // Takes out the held replies `take` is true of, in the order held.
  template <typename Pred>
  void TakeWhere(Pred take, std::vector<Ticket>* taken);

  const Options options_;
  int64_t elements_per_iteration_;  // 0 until known
  absl::flat_hash_map<int, Position> positions_;
  std::vector<int> members_;
  std::vector<Held> held_;  // in the order held
  int64_t iteration_ = 0;   // of the latest push recorded
  Ticket next_ticket_ = 1;
};

}  // namespace ps::server

#endif  // PS_SERVER_PUSH_PACER_H_
