#ifndef PS_SERVER_STATE_CAPTURE_H_
#define PS_SERVER_STATE_CAPTURE_H_

// The server's state as a checkpoint holds it, and the requests to capture
// it. A capture must see a version boundary: every chunk at the server's
// version, nothing of the next iteration applied. When a request comes
// mid-iteration, the updates of the iterations past the first boundary no
// chunk has passed are held back (under ssp:S several iterations are in
// flight), the request is served at that boundary, and the held-back
// updates are applied right after.

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "common/optimizer/loss_scale.h"
#include "common/optimizer/optimizer.h"
#include "common/param_spec.h"
#include "server/chunk_table.h"

namespace ps::server {

// The server's whole state at a version boundary (between two iterations).
struct ServerState {
  int64_t version = 0;          // parameters after this many updates
  int64_t steps_per_epoch = 0;  // the learning-rate schedule's epoch length
  std::vector<ParamSpec> signature;
  std::vector<float> parameters;  // flat, in signature order
  std::vector<float> momentum;    // flat; empty without momentum
  // Dynamic loss scaling (0 without): the scale of iteration `version`,
  // the clean iterations before it in a row, the iterations skipped.
  float loss_scale = 0;
  int64_t loss_scale_clean_iterations = 0;
  int64_t loss_scale_skipped_iterations = 0;
};

// Whether a server can resume from `state` (a checkpoint's, so possibly
// corrupt or another job's): kInvalidArgument for a negative version or
// steps per epoch, an empty signature, a momentum buffer of the wrong size,
// with non-finite values, or present where the optimizer has no momentum
// (or absent where it has), and a loss scale that is not a power of two
// from 2^-24 to 2^24 (with `dynamic_loss_scale`). Sizes against the
// signature are the server's to check.
absl::Status CheckServerState(const ServerState& state, bool with_momentum,
                              bool dynamic_loss_scale);

// The state of a server at `version` whose parameters `table` holds and
// whose momentum `optimizer` holds (null: no update yet, so zeros where
// `options` has momentum); steps per epoch -1 (not known) is saved as 0.
ServerState CaptureServerState(const ChunkTable& table, const Optimizer* optimizer,
                               const OptimizerOptions& options, int64_t version,
                               int64_t steps_per_epoch, const LossScaleState& loss_scale);

// The capture requests waiting for a boundary, and the updates they hold
// back. Not thread-safe: the server calls it under its bookkeeping lock.
class CaptureRequests {
 public:
  using Done = std::function<void(ServerState)>;

  // Files a request; served at the next boundary (Release).
  void Add(Done done) { pending_.push_back(std::move(done)); }
  bool empty() const { return pending_.empty(); }
  // Serves the requests at once (the caller is at a boundary): takes them.
  std::vector<Done> TakeAll();

  // Holds back the updates of iteration `first_held` on (the least version
  // no chunk can pass), unless updates are held back already.
  void HoldBackFrom(int64_t first_held);
  // Whether the update of `iteration` must wait for the captures.
  bool HoldsBack(int64_t iteration) const { return iteration >= first_held_; }
  // An update was left waiting (applied on Release).
  void NoteHeldBack() { held_back_ = true; }

  // What a boundary or a cancellation hands back: the requests to serve
  // (outside the lock) and whether updates were held back, which the
  // caller applies then.
  struct Release {
    std::vector<Done> captures;
    bool resume = false;
  };
  // The server reached `version`: the boundary the requests wait for when
  // nothing from `version` on may be applied; else nothing.
  Release AtBoundary(int64_t version);
  // Drops every request (never served); returns how many and whether
  // updates were held back.
  Release Cancel(int* dropped);

  // How many times held-back updates were applied together.
  int64_t releases() const { return releases_; }
  void CountRelease() { ++releases_; }

 private:
  static constexpr int64_t kNoLimit = INT64_MAX;
  std::vector<Done> pending_;
  int64_t first_held_ = kNoLimit;
  bool held_back_ = false;
  int64_t releases_ = 0;
};

}  // namespace ps::server

#endif  // PS_SERVER_STATE_CAPTURE_H_
