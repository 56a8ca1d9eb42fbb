#ifndef PS_WORKER_REPLICA_OVERLAP_H_
#define PS_WORKER_REPLICA_OVERLAP_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "worker/model/parameter_hooks.h"
#include "worker/push_pull_scheduler.h"

namespace ps::worker {

// One training step's overlap of communication with compute for a worker
// whose D replicas live in host memory (CPU devices): the hooks each
// replica's pass calls, merged into the calls the PushPullScheduler takes,
// so the first buckets are pushed while backward goes on however many
// devices there are.
//
// Backward: replica d reports that its gradients from an offset to the end
// of the flat buffer are final (a layer's AfterBackward, or a Linear's
// rows as they come, GradientsReady). Once every computing replica has a
// region final, the region is summed into replica 0's gradients in device
// order, ((g0 + g1) + g2) ..., as DeviceCollective::ReduceSumToRoot sums,
// so the step pushes exactly what the non-overlapped path pushes, and its
// buckets are handed to the scheduler: EarlyGradientsFrom while some
// replica still reads the region's parameters, GradientsReadyFrom once
// none does. Each replica's offsets only decrease (backward runs back to
// front), so the region all have final is [max over d of offset_d, end).
// The thread whose report completes a region sums it and hands it over
// before its report returns, under the object's lock: the scheduler hears
// the regions in decreasing order, and a replica that reports meanwhile
// waits (a sum is one pass over the region, short beside the backward of
// the layers that made it).
//
// Forward: pulls land in replica 0's parameters (the wire buffers). Replica
// 0 waits for a layer's range; replica d > 0 waits for it and copies it
// from replica 0. Replica 0's range is not written again until every
// replica has finished that layer's backward (its next pull follows the
// next push), so the copy reads a stable range.
//
// Replicas with an empty shard run no pass and report nothing: they are
// left out of the sum (the non-overlapped path adds their zeros). The
// batch's split gives replica 0 the largest shard, so it computes whenever
// any replica does.
//
// Thread safety: hooks(d) is called from replica d's thread; BeginStep and
// FinishStep from the trainer's, before and after the passes.
class ReplicaOverlap {
 public:
  // gradients[d] and parameters[d]: replica d's flat buffers of
  // `num_parameters` floats, host memory, [0] the scheduler's. All outlive
  // this object, as does the scheduler.
  ReplicaOverlap(PushPullScheduler* scheduler, std::vector<float*> gradients,
                 std::vector<float*> parameters, int64_t num_parameters);
  ~ReplicaOverlap();

  // Which replicas run a pass this step. kInvalidArgument for the wrong
  // count, or when replica 0 does not compute but another does.
  absl::Status BeginStep(const std::vector<bool>& computing);
  // Replica d's hooks; valid while this object lives.
  model::ParameterHooks* hooks(int d);
  // Once every pass has returned: sums and hands over what no report
  // covered (everything, for a pass that called no hook), ending with
  // GradientsReadyFrom(0).
  void FinishStep();

 private:
  class Hooks;

  // Replica d's gradients are final from `offset` on; `released`: it reads
  // the parameters there no more. Returns once every region this report
  // completed is summed and handed to the scheduler.
  void Report(int d, int64_t offset, bool released);
  // Sums and hands over whatever the reports allow.
  void Advance() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Replica 0's gradients [begin, end) += each other computing replica's.
  void Sum(int64_t begin, int64_t end) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CopyParameters(int d, int64_t begin, int64_t end);

  PushPullScheduler* const scheduler_;
  const std::vector<float*> gradients_;
  const std::vector<float*> parameters_;
  const int64_t num_parameters_;
  std::vector<std::unique_ptr<Hooks>> hooks_;
  std::vector<bool> computing_;  // set by BeginStep, read while passes run
  // The computing replicas' gradients after replica 0's, in device order
  // (BeginStep): what Sum adds.
  std::vector<const float*> summed_replicas_;

  absl::Mutex mu_;
  std::vector<int64_t> final_from_ ABSL_GUARDED_BY(mu_);     // per replica
  std::vector<int64_t> released_from_ ABSL_GUARDED_BY(mu_);  // per replica
  int64_t summed_from_ ABSL_GUARDED_BY(mu_);     // [summed_from_, end) in replica 0
  int64_t early_from_ ABSL_GUARDED_BY(mu_);      // handed over with EarlyGradientsFrom
  int64_t ready_from_ ABSL_GUARDED_BY(mu_);      // handed over with GradientsReadyFrom
};

}  // namespace ps::worker

#endif  // PS_WORKER_REPLICA_OVERLAP_H_
