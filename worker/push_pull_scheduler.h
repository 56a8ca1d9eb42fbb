#ifndef PS_WORKER_PUSH_PULL_SCHEDULER_H_
#define PS_WORKER_PUSH_PULL_SCHEDULER_H_

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "worker/parameter_store.h"

namespace ps::worker {

struct PushPullOptions {
  // Consecutive store segments are grouped into buckets of at least this
  // many bytes (the last bucket may be smaller): the unit of readiness, of
  // priority and of one push and one pull. DDP buckets 25 MB; BytePS
  // partitions 4 MB. 0: one bucket per segment. A segment of this many
  // bytes or more is always a bucket of its own (the small segments before
  // it close their bucket, however small): it never waits for a small
  // neighbour's gradients, e.g. the tail of the layer in front, computed
  // last in backward, nor makes that layer's forward wait for its own
  // pull. The default, 4 MB (not MiB), gives each of a server's full
  // messages (4 MiB less a little) a bucket of its own and packs small
  // tensors together: two messages to a bucket made each pull wait for
  // both pushes.
  int64_t bucket_bytes = 4000000;
  // Bounds the bytes of pushes in flight, and separately the bytes of pulls
  // in flight (the link is full duplex), on each stream (a sharded store's
  // shard) on its own, so a large back-layer transfer cannot hold up the
  // front layers the next forward needs first, and every shard is kept
  // busy at once. One bucket is always let through, however large. 0: no
  // bound.
  int64_t max_bytes_in_flight = 32000000;
  // A bucket whose gradients came early (EarlyGradientsFrom: its layer
  // still reads its parameters, computing its input gradient) is pulled at
  // once into a staging buffer of the model's size, and copied into the
  // parameters when GradientsReadyFrom lets go of them, instead of being
  // pulled only then: on a slow link the pull direction starts with the
  // push direction instead of after the layer's backward (MLP-20M's fc2:
  // its 64 MB of pulls began 90 ms later behind 1 Gbit/s). Costs one
  // model's memory and one copy of those buckets; for a store that updates
  // the parameters in place in this process there is nothing to gain.
  bool stage_early_pulls = false;
};

// The communication stage of a worker's pipeline (P3, ByteScheduler): the
// flat gradient and parameter buffers cut into buckets of store segments;
// each bucket is pushed as soon as backward has produced its gradients and
// pulled as soon as its push is accepted (the store holds the pull until
// every worker's push of that bucket is applied), and the next forward
// waits only for the buckets its layer needs.
//
// Scheduling: pending pushes go out front layers first (the next forward
// needs them first), and so do pending pulls, each direction and each
// stream (ParameterStore::SegmentStreams: a bucket never spans two) within
// PushPullOptions::max_bytes_in_flight, the streams independently: a shard
// whose next bucket has to wait does not hold up the others. Within a layer the buckets go from
// the last, the order backward hands them over: every worker then sends
// the same bucket at about the same time, whichever of them is ahead of
// its backward, so the server can complete each bucket as its pushes
// arrive (sending a layer's buckets front first instead, a worker whose
// backward was a block further would send a bucket the other had not
// made yet, and the server's pulls stalled for both: MLP-20M behind
// 1 Gbit/s). A layer that waits for its parameters in parts reads them in
// the same order (Layer::AwaitsParametersInParts). No
// thread of its own: the store's calls are asynchronous, so the thread that
// makes work available (the compute thread reporting gradients, a store
// completion reporting a push done) issues what may go next, without
// holding the scheduler's lock while it calls the store.
//
// Per iteration (one thread calls BeginIteration, GradientsReadyFrom and
// the Await calls; completions arrive on the store's threads):
//   BeginIteration(samples)       -> pushes now carry iteration version(),
//                                    version() goes up by one
//   AwaitParameters(begin, end)   -> (the forward pass, layer by layer) the
//                                    range holds the previous iteration's
//                                    result
//   EarlyGradientsFrom(offset)    -> (inside a layer's backward, optional)
//                                    push the buckets wholly above offset,
//                                    hold their pulls (or, staging, let
//                                    them land aside)
//   GradientsReadyFrom(offset)    -> (the backward pass, layer by layer)
//                                    push the buckets wholly above offset,
//                                    and let their pulls land
//   AwaitAll()                    -> (optional) every bucket holds version()
// The gradient buffer's bucket must not change from its first ...From call
// until its push is done, and the parameter buffer's bucket must not be
// read between GradientsReadyFrom covering it and AwaitParameters returning
// for it: the caller's forward waits, and backward writes a bucket's
// gradients only after the forward that waited for it. So a bucket's
// gradients also stay unchanged until its pull is done, which a store that
// works in these very buffers relies on (ParameterStore::BindBuffers).
//
// Errors: the first failing push or pull is kept; every later Await returns
// it and nothing more is issued.
class PushPullScheduler {
 public:
  // `gradients` and `params` are the flat host buffers pushes read and pulls
  // write; `store` is registered; the buckets start holding `version`. All
  // must outlive the scheduler. `layer_begins`: the offsets, ascending, at
  // which the model's layers' parameters begin (ParameterHooks' ranges), for
  // the priority order; empty: each bucket a layer of its own. kInvalidArgument
  // for buffers that do not match the store's segments, a negative option or
  // layer offsets that are not ascending within the buffers.
  static absl::StatusOr<std::unique_ptr<PushPullScheduler>> Create(
      const PushPullOptions& options, ParameterStore* store, absl::Span<const float> gradients,
      absl::Span<float> params, int64_t version, absl::Span<const int64_t> layer_begins = {});
  // Waits for the calls in flight (they hold the buffers), issuing no more.
  ~PushPullScheduler();

  // Starts an iteration: the pushes that follow carry iteration version()
  // and `num_samples`, and their pulls bring version() + 1, which version()
  // then returns. The previous iteration's pulls may still be in flight.
  // kFailedPrecondition unless every bucket was pushed in the previous
  // iteration; or the kept error.
  absl::Status BeginIteration(int64_t num_samples);

  // Gradient elements [offset, end of buffer) are final for the iteration,
  // and the caller reads the parameters there no more in it: every bucket
  // that lies wholly inside and was not pushed yet is queued, its pull may
  // follow its push, and what may go is issued. Offsets only decrease within
  // an iteration; GradientsReadyFrom(0) queues the rest.
  void GradientsReadyFrom(int64_t offset);
  // The same, but the caller still reads the parameters there (a layer that
  // has its weight gradients and computes its input gradient next): the
  // buckets' pushes may go, their pulls wait for GradientsReadyFrom.
  void EarlyGradientsFrom(int64_t offset);

  // Blocks until no bucket meeting [begin, end) has a push or pull in flight
  // or queued: each holds the version the current iteration started from
  // (not pushed yet in it) or the one it produces (pushed and pulled), or
  // returns the kept error.
  absl::Status AwaitParameters(int64_t begin, int64_t end);
  // Whether AwaitParameters(begin, end) would return without blocking.
  bool HasParameters(int64_t begin, int64_t end) const;
  // Blocks until every push of the iteration has been accepted.
  absl::Status AwaitPushes();
  // Blocks until every bucket that was pushed in the iteration holds its new
  // version (all of them, after GradientsReadyFrom(0)).
  absl::Status AwaitAll();

  // The version the current iteration's pulls bring (the one the buckets
  // hold before the first iteration).
  int64_t version() const;
  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  // Bucket b's element range [begin, end) and segment range.
  struct Bucket {
    int64_t begin = 0, end = 0;
    int first_segment = 0, last_segment = 0;
    int stream = 0;  // its segments' (ParameterStore::SegmentStreams)
    int64_t bytes() const { return (end - begin) * static_cast<int64_t>(sizeof(float)); }
  };
  const Bucket& bucket(int b) const { return buckets_[b]; }

 private:
  enum class State {
    kHeld,  // no call queued or in flight
    kPushQueued,
    kPushing,
    kPullQueued,
    kPulling,
    kStaged,   // pulled into staging_, its layer still reading the parameters
    kCopying,  // from staging_ into the parameters
  };
  struct Operation {
    int bucket = -1;
    bool push = false;
  };

  PushPullScheduler(const PushPullOptions& options, ParameterStore* store,
                    absl::Span<const float> gradients, absl::Span<float> params,
                    int64_t version);
  // Fills priority_order_ from buckets_ and the layers' first offsets.
  void OrderBuckets(absl::Span<const int64_t> layer_begins);

  // Issues every queued operation that may go now, in priority order.
  void Pump();
  // The next operation to issue, marked in flight; bucket -1 for none.
  Operation NextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnDone(Operation op, absl::Status status);
  // Copies the staged buckets `buckets` (marked kCopying) into the
  // parameters, then marks them kHeld. Called without mu_.
  void CopyStaged(const std::vector<int>& buckets);
  // Queues the pushes of the buckets wholly at or above `offset`.
  void QueuePushesLocked(int64_t offset) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Blocks until no bucket is in one of `states`, or there is an error.
  absl::Status AwaitNoBucketIn(std::initializer_list<State> states);
  // Whether bucket b's pull would land where the caller still reads the
  // parameters: it is of this iteration and lies below released_from_ (a
  // previous iteration's, queued behind the bound or landing late, may).
  bool PullHeldLocked(int b) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // AwaitParameters' condition.
  bool HasParametersLocked(int64_t begin, int64_t end) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const PushPullOptions options_;
  ParameterStore* const store_;
  const absl::Span<const float> gradients_;
  const absl::Span<float> params_;
  std::vector<Bucket> buckets_;
  // The buckets in priority order (see Scheduling above).
  std::vector<int> priority_order_;

  mutable absl::Mutex mu_;
  std::vector<State> state_ ABSL_GUARDED_BY(mu_);
  // Per bucket: whether it has been queued for a push in the current
  // iteration, and the iteration its push (and version its pull) is for.
  std::vector<bool> pushed_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> iteration_of_ ABSL_GUARDED_BY(mu_);
  // Staging (options_.stage_early_pulls): per bucket, whether its pull in
  // flight or done lands in staging_.
  std::vector<float> staging_;
  std::vector<bool> staged_ ABSL_GUARDED_BY(mu_);
  int64_t version_ ABSL_GUARDED_BY(mu_);  // version() above
  // Pulls may land at and above this offset in the current iteration (the
  // caller no longer reads the parameters there).
  int64_t released_from_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t num_samples_ ABSL_GUARDED_BY(mu_) = 0;
  // Per stream (Bucket::stream).
  std::vector<int64_t> push_bytes_in_flight_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> pull_bytes_in_flight_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> full_streams_ ABSL_GUARDED_BY(mu_);  // NextLocked's scratch
  int calls_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ps::worker

#endif  // PS_WORKER_PUSH_PULL_SCHEDULER_H_
