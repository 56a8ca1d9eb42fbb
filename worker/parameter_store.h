#ifndef PS_WORKER_PARAMETER_STORE_H_
#define PS_WORKER_PARAMETER_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/types/span.h"
#include "common/param_spec.h"
#include "worker/consistency.h"

namespace ps::worker {

// Where the training loop sends gradients and gets parameters. The local
// implementation applies SGD in this process; the remote one talks gRPC to
// the parameter server. The loop is the same code either way.
//
// Protocol, per iteration t (starting at the version Register returns):
//   Push(t, samples, gradient sum of this worker)   -> returns once accepted
//   WaitForVersion(t + 1)                           -> all workers have pushed
//   Pull(t + 1, params)                             -> the new parameters
// Buffers are host memory, flat, in signature order; the caller owns them
// and may reuse them as soon as a call returns. The blocking calls for one
// store come from one thread; the segment calls below may come from
// several at once (see there).
//
// The pipelined protocol does the same per segment: the flat buffer is cut
// into segments (SegmentEnds) that move independently, so a worker pushes
// each segment as soon as backward has produced its gradient and pulls it
// while the rest of the step runs. Per iteration t and segment s:
//   PushSegments(t, samples, s, s + 1, ...)   -> done once accepted
//   PullSegments(t + 1, s, s + 1, ...)        -> done once every worker's
//                                                push of s is applied
// A store holds a segment's pull until its new version exists; segments of
// one iteration may be pushed and pulled in any order and concurrently.
class ParameterStore {
 public:
  virtual ~ParameterStore() = default;

  struct Registration {
    int rank = 0;
    int num_workers = 1;
    int64_t version = 0;  // the version to pull first
    // The ranks taking part in iteration `version` (empty: all of them).
    std::vector<int> members;
    // The members may change from one iteration to the next (the server
    // shrinks the job when it loses a worker): read them with Members.
    bool dynamic_members = false;
    // The server's consistency policy, as it bears on this worker's steps
    // and pulls (worker/consistency.h); sync without a server.
    WorkerConsistency consistency;
    // Dynamic loss scaling (the server's --loss_scale=dynamic): the scale
    // of iteration `version`'s loss; 0 when the server does not scale.
    float loss_scale = 0;
    // What the store does with the pushed gradients, as OptimizerOptions::
    // kind spells it (common/optimizer/optimizer.h): "sgd", each version is
    // the parameters after the store's update (a local store; a server with
    // --optimizer=sgd); "none", each version after 0 is the mean gradient
    // of its iteration (a sum-only server, --optimizer=none), which the
    // worker applies with an optimizer of its own. Every shard of a sharded
    // store runs the same.
    std::string optimizer = "sgd";
    // The run of the job the store's state belongs to (proto
    // RegisterReply.job_run); empty for stores without a server, or a
    // server that has none yet.
    std::string job_run;
  };

  // Registers this worker's model signature. `proposed` holds this worker's
  // own initial parameters; the store uses them only if it has none (a server
  // started from a weights file keeps its own). Pull(version) then returns
  // the parameters actually used.
  virtual absl::StatusOr<Registration> Register(const std::vector<ParamSpec>& signature,
                                                absl::Span<const float> proposed) = 0;

  // Sends this worker's gradient, summed over its `num_samples` samples, for
  // iteration `iteration`.
  virtual absl::Status Push(int64_t iteration, int64_t num_samples,
                            absl::Span<const float> gradient) = 0;

  // Blocks until version `version` is published (every worker's push for
  // iteration version - 1 has been applied). kDeadlineExceeded if it takes
  // longer than the store's deadline.
  virtual absl::Status WaitForVersion(int64_t version) = 0;

  // Copies version `version` (or a newer one) into `params`; returns the
  // version copied. Remote stores copy exactly `version` (after Register
  // or Reconnect: the version a worker resumes from), or under ssp:S the
  // newest of version `version` - S or later.
  virtual absl::StatusOr<int64_t> Pull(int64_t version, absl::Span<float> params) = 0;

  // The segments, as ascending (non-decreasing: a segment may be empty) end
  // offsets into the flat buffer, in elements; the last is the model's size.
  // A remote store's segments are its messages; a local store's, its
  // tensors. Empty before Register.
  virtual std::vector<int64_t> SegmentEnds() const = 0;

  // Per segment (SegmentEnds' order), the stream it travels on: segments
  // of different streams move independently (a sharded store's shards,
  // each over its own connections to its own host), so a scheduler keeps
  // each stream busy, and bounds its bytes in flight, on its own. One
  // stream, 0, by default.
  virtual std::vector<int> SegmentStreams() const {
    return std::vector<int>(SegmentEnds().size(), 0);
  }

  // Completion of an asynchronous call: run exactly once, on any thread
  // (possibly inside the call that started it), with OK or the first error.
  using Done = std::function<void(absl::Status)>;

  // Starts pushing segments [first, last) of `gradient` (the whole flat
  // buffer; only those segments are read) for `iteration`, summed over this
  // worker's `num_samples` samples of the iteration (the same in every call
  // of one iteration), and returns at once. Those segments must not change
  // until `done` runs. kInvalidArgument (through done) for a bad range or
  // buffer size.
  virtual void PushSegments(int64_t iteration, int64_t num_samples, int first, int last,
                            absl::Span<const float> gradient, Done done) = 0;

  // Starts pulling segments [first, last) of version `version` into
  // `params` (the whole flat buffer; only those segments are written) and
  // returns at once; the store or server holds the pull until those
  // segments of that version exist (or the store's deadline passes:
  // kDeadlineExceeded). kInternal when a reply carries another version.
  // Those segments of `params` must not be read or written until `done`.
  //
  // Several Push/PullSegments may be in flight at once, started from any
  // thread, also from inside another call's `done` (the pipeline's
  // scheduler starts them from the training thread and from gRPC's
  // completion threads): implementations are thread-safe for them. They
  // must not overlap the blocking calls above.
  virtual void PullSegments(int64_t version, int first, int last, absl::Span<float> params,
                            Done done) = 0;

  // The ranks taking part in iteration `iteration` (ascending): a worker's
  // part of the global batch is its index among them. Blocks until the store
  // knows them: from the registration for its version, from the replies to
  // the pushes of iteration - 1 for the others. Default: every rank, always.
  virtual absl::StatusOr<std::vector<int>> Members(int64_t iteration, int num_workers) {
    std::vector<int> all(num_workers);
    for (int r = 0; r < num_workers; ++r) all[r] = r;
    return all;
  }

  // Dynamic loss scaling: the scale to multiply the loss of the next step
  // by, as the server published it with the newest parameters pulled (once
  // every segment of version v is in, v's scale); 0 when the server does
  // not scale (the default). Thread-safe.
  virtual float LossScale() const { return 0; }

  // Registers again after the store lost its server (a call failed with a
  // status IsServerLost accepts: the server process restarted, or shut
  // down and came back), waiting for it within the store's bounds, with
  // the same signature and `proposed` as Register, asking for the rank it
  // held. Returns the new registration: the worker resumes at its version
  // (pulling it with Pull), which may be older than where it was (the
  // server restarted from a checkpoint) or the same. No call may be in
  // flight. Default: kUnimplemented, for stores that cannot lose their
  // server.
  virtual absl::StatusOr<Registration> Reconnect(const std::vector<ParamSpec>& signature,
                                                 absl::Span<const float> proposed) {
    return absl::UnimplementedError("this parameter store cannot reconnect");
  }

  // Zero copy in one address space: a store that keeps its parameters in
  // this process (the local store) may work in the caller's own flat host
  // buffers instead of copies of them. Once BindBuffers returns OK, `params`
  // holds the store's parameters (their current values are written there
  // now) and pulls update them in place, and pushes read `gradients` where
  // it lies; every later push and pull passes exactly these buffers
  // (kInvalidArgument for a push from another), and both must outlive the
  // store. The contracts above become stricter: a segment of `gradients`
  // must not change from its push until its pull has completed (the store
  // may read it until then), and the caller never writes `params` (a pull
  // writes a segment while it is in flight, as before). Call after
  // Register, with no call in flight. kUnimplemented (the default) for a
  // store that cannot: the caller goes on as without. kInvalidArgument for
  // buffers that do not hold the model; kFailedPrecondition before
  // registration.
  virtual absl::Status BindBuffers(absl::Span<const float> gradients, absl::Span<float> params) {
    return absl::UnimplementedError("this parameter store does not work in the caller's buffers");
  }
};

// Whether a store call's error means the server went away or restarted, so
// that Reconnect (rather than failing) is the answer: UNAVAILABLE (not
// reachable, or refusing calls while it shuts down), CANCELLED (a call the
// server cancelled as it shut down: workers never cancel their own) and
// ABORTED (a server process that does not know this worker's session: it
// restarted).
inline bool IsServerLost(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnavailable ||
         status.code() == absl::StatusCode::kCancelled ||
         status.code() == absl::StatusCode::kAborted;
}

// Runs an asynchronous call to completion: start(done) begins it, and this
// returns done's status once it has run, on whichever thread.
inline absl::Status AwaitDone(const std::function<void(ParameterStore::Done)>& start) {
  absl::Notification finished;
  absl::Status status;
  start([&](absl::Status s) {
    status = std::move(s);
    finished.Notify();
  });
  finished.WaitForNotification();
  return status;
}

}  // namespace ps::worker

#endif  // PS_WORKER_PARAMETER_STORE_H_
