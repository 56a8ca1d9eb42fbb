#ifndef PS_SERVER_CONSISTENCY_CONSISTENCY_H_
#define PS_SERVER_CONSISTENCY_CONSISTENCY_H_

// How the server orders the workers' pushes into updates: the consistency
// policy. Every decision that differs between sync, async and ssp:S lives
// behind this interface, one file per implementation (sync.cc, async.cc,
// ssp.cc), and ParseConsistency is the only place that knows their names.
// The worker's counterpart, built from the registration reply, is
// worker/consistency.h.
//
// A policy is an immutable value: every method is const and thread-safe,
// and ParameterServer, the gRPC service and the checkpointer share one.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ps::server {

class Consistency {
 public:
  virtual ~Consistency() = default;

  // The policy as --consistency and RegisterReply.consistency spell it:
  // "sync", "async" or "ssp:S". Checkpoints record it, and a restart under
  // another name is refused.
  virtual std::string Name() const = 0;

  // Iterations in flight at once: with the server at version v, pushes for
  // iterations v .. v + Window() - 1 are taken. At least 1.
  virtual int64_t Window() const { return 1; }

  // True: every push is applied alone as it arrives, scaled by its own
  // samples (ParameterServer::ApplyNow), and there are no iterations.
  // False: the pushes of an iteration are summed in rank order and applied
  // once every member has pushed (ParameterServer::PushChunkBytes).
  virtual bool AppliesEachPush() const { return false; }

  // OK when a push for `iteration` may be taken by a server at `version`
  // as far as the policy's bound goes; kOutOfRange, saying when it may be
  // computed, when it runs ahead of the bound (the caller adds which ranks
  // it waits for). Iterations outside the window are refused by the caller.
  virtual absl::Status CheckNotAhead(int64_t iteration, int64_t version) const;

  // What a summed push's reply announces as its staleness (the iterations
  // before `iteration` whose updates the parameters it was computed from,
  // `based_on_version`, lacked), or nothing. Asynchronous pushes announce
  // ApplyNow's count instead.
  virtual std::optional<int64_t> ReplyStaleness(int64_t iteration,
                                                int64_t based_on_version) const;

  // OK when a lost worker may be dropped and the job shrunk
  // (--on_worker_loss=shrink); kFailedPrecondition saying why not.
  virtual absl::Status CheckCanShrink() const = 0;

  // Whether dynamic loss scaling (one scale per iteration, skipped on
  // overflow by every worker at once) is defined under this policy.
  virtual bool SupportsLossScaling() const { return false; }

  // Whether a push may be held back so that no worker runs more than
  // --max_push_lead_bytes ahead of the slowest member of its iteration.
  virtual bool PacesPushes() const { return false; }
};

// The largest S of ssp:S: each iteration in flight holds a sum of the whole
// model, so the bound also bounds the server's memory (Window() + 2 copies).
inline constexpr int64_t kMaxStaleness = 64;

// The policies, for code that names one directly (tests, the defaults).
std::shared_ptr<const Consistency> SyncConsistency();
std::shared_ptr<const Consistency> AsyncConsistency();
// kInvalidArgument for a bound outside 0 .. kMaxStaleness.
absl::StatusOr<std::shared_ptr<const Consistency>> SspConsistency(int64_t staleness);

// "sync", "async" or "ssp:S" (S a whole number 0 .. kMaxStaleness, digits
// only). kInvalidArgument, quoting the text and naming the choices, for
// anything else.
absl::StatusOr<std::shared_ptr<const Consistency>> ParseConsistency(absl::string_view text);

}  // namespace ps::server

#endif  // PS_SERVER_CONSISTENCY_CONSISTENCY_H_
