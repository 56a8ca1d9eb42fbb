#ifndef PS_WORKER_SHARDED_PARAMETER_STORE_H_
#define PS_WORKER_SHARDED_PARAMETER_STORE_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/timed_event.h"
#include "worker/device_threads.h"
#include "worker/parameter_store.h"
#include "worker/remote_parameter_store.h"
#include "worker/shard_plan.h"

namespace ps::worker {

struct ShardedStoreOptions {
  // One host:port per shard, in shard order. Every worker of the job must
  // list the same shards in the same order (the plan numbers them).
  std::vector<std::string> shard_addresses;
  // The rest of every shard's RemoteParameterStore: worker id, the rank to
  // ask for, steps per epoch, timeouts, observer and clock. Its
  // server_address is ignored.
  RemoteStoreOptions remote;
  ShardPlanOptions plan;
};

// The parameter store over S parameter-server shards, each an ordinary,
// unchanged server that knows no model: the sharding lives here. Register
// works out the plan (worker/shard_plan.h: shard s holds one contiguous
// element range of the flat buffer, as whole tensors and 1-D range pieces)
// and registers each shard's sub-signature with it; Push and Pull hand each
// shard's RemoteParameterStore its span of the caller's buffer and run the
// shards concurrently (Push through PushSegments, with no thread of its
// own; Pull, WaitForVersion and Register on one long-lived thread per
// shard), each store sending its own messages concurrently too. No tensor bytes are copied beyond what
// RemoteParameterStore copies (a pull reply out of gRPC's slices), since a
// shard's flat buffer is a slice of the worker's.
//
// Register asks the first shard for the configured rank, then every other
// shard for the rank the first gave (so concurrent workers cannot end up
// with different ranks on different shards); rank, number of workers,
// version, optimizer, consistency, loss scaling and worker-loss policy must
// then agree across shards, else kFailedPrecondition naming both shards; shards
// at different versions (resumed from different checkpoints) are brought to
// one as Reconnect does. Rank 0 sends each shard that asks its part of `proposed`.
// Shards the plan leaves empty (more shards than elements) take no part.
//
// Every error names the shard's index and address, and keeps the shard's
// status code; when several shards fail, the lowest shard's error is
// returned. Push and Register's `proposed` are read by gRPC's threads until
// the call returns, as with RemoteParameterStore. Pull returns
// kInternal when the shards replied with different versions. The blocking
// calls are not thread-safe (one at a time); Push/PullSegments, as
// parameter_store.h says, may come from several threads.
//
// Job run: Register proposes to the first shard a random run id (or the
// one it knows), and to every other shard the run the first one holds, so
// every shard of one run records the same id (proto RegisterReply.job_run)
// in its checkpoints; shards of different runs are refused.
//
// Reconnect (a shard lost, or all of them; the consistent-cut rule of
// docs/sharding.md): registers again with every shard (each asking for the
// rank it held and proposing this run), refuses a shard whose run is
// another (kFailedPrecondition naming it: another job's checkpoint
// directory) and, while another is past version 0, a shard that came back
// without any state (no run: an empty checkpoint directory; while all are at
// 0 the job just starts again), takes v* = the least version the shards answer, asks every
// shard above it to Restore its checkpoint of v* (concurrently), and
// repeats until every shard answers v* (a restore drops every session, and
// other workers restore concurrently), within the remote options'
// reconnect_timeout (kDeadlineExceeded beyond). A shard that cannot go
// back to v* fails it with kFailedPrecondition naming that shard and the
// shard at v*. Refused under asynchronous consistency, whose versions
// count updates, not iterations (kFailedPrecondition).
//
// Observer events: shard s's message m is reported on
// RpcLane(s * kRpcLanesPerShard + m % kRpcLanesPerShard), so "rpc 1003" on
// a timeline is shard 1's message 3; lanes repeat only beyond
// kRpcLanesPerShard messages per shard (4 GB of fp32 per shard in 4 MiB
// messages).
class ShardedParameterStore final : public ParameterStore {
 public:
  static constexpr int kRpcLanesPerShard = 1000;

  // kInvalidArgument for no addresses, an empty or repeated address, or
  // RemoteStoreOptions that RemoteParameterStore::Create refuses.
  static absl::StatusOr<std::unique_ptr<ShardedParameterStore>> Create(
      const ShardedStoreOptions& options);
  ~ShardedParameterStore() override;

  absl::StatusOr<Registration> Register(const std::vector<ParamSpec>& signature,
                                        absl::Span<const float> proposed) override;
  absl::Status Push(int64_t iteration, int64_t num_samples,
                    absl::Span<const float> gradient) override;
  absl::Status WaitForVersion(int64_t version) override;
  absl::StatusOr<int64_t> Pull(int64_t version, absl::Span<float> params) override;
  absl::StatusOr<Registration> Reconnect(const std::vector<ParamSpec>& signature,
                                         absl::Span<const float> proposed) override;

  // The shards' segments one after the other (shard s's shifted by its
  // range's start). Push/PullSegments start each shard's part of the range
  // on that shard's store, no thread of their own involved, and run `done`
  // once every shard's is done, with the lowest shard's error.
  std::vector<int64_t> SegmentEnds() const override;
  // Each segment's shard index: the shards stream independently.
  std::vector<int> SegmentStreams() const override;
  // Shard 0's: every shard decides the same scales (each sees every
  // worker's overflows, since an overflowing worker poisons every chunk).
  float LossScale() const override;
  // The members every shard announced for `iteration` (a job that shrinks);
  // kFailedPrecondition, naming both, when two shards announce different
  // ones, and each shard's RemoteParameterStore::Members error otherwise.
  absl::StatusOr<std::vector<int>> Members(int64_t iteration, int num_workers) override;
  void PushSegments(int64_t iteration, int64_t num_samples, int first, int last,
                    absl::Span<const float> gradient, Done done) override;
  void PullSegments(int64_t version, int first, int last, absl::Span<float> params,
                    Done done) override;

  // Tensor payload so far, summed over the shards (RemoteParameterStore's).
  int64_t bytes_pushed() const;
  int64_t bytes_pulled() const;
  // Push messages by staleness (updates behind, as the shards reported
  // them), summed over the shards: RemoteParameterStore's histogram for a
  // sharded job. Empty under sync, which reports none.
  std::map<int64_t, int64_t> staleness_histogram() const;
  // Whether Register sent this worker's initial parameters to any shard.
  bool sent_initial_parameters() const;
  // The plan Register worked out (empty before).
  const ShardPlan& plan() const { return plan_; }
  // The job run every shard holds ("" before Register).
  const std::string& job_run() const { return job_run_; }
  int num_shards() const { return static_cast<int>(options_.shard_addresses.size()); }

 private:
  class LaneShift;
  struct Shard {
    int index = 0;  // in shard_addresses and the plan
    std::string address;
    std::unique_ptr<LaneShift> observer;
    std::unique_ptr<RemoteParameterStore> store;
  };

  explicit ShardedParameterStore(const ShardedStoreOptions& options);
  // Runs fn on every shard taking part, concurrently; the lowest shard's
  // error, prefixed with its index and address.
  absl::Status OnEveryShard(const std::function<absl::Status(Shard&)>& fn);
  absl::Status NameShard(const Shard& shard, const absl::Status& status) const;
  absl::StatusOr<std::unique_ptr<RemoteParameterStore>> MakeStore(Shard& shard, int rank) const;
  // kFailedPrecondition naming both shards unless every registration
  // agrees with the first on optimizer, consistency, loss scaling, policy,
  // rank, job size, job run and (when `same_version`) version.
  absl::Status CheckAgreement(const std::vector<Registration>& registrations,
                              bool same_version) const;
  // Each shard's part of `proposed` (empty when it is not a model's worth).
  absl::Span<const float> PartOf(const Shard& shard, absl::Span<const float> proposed) const;
  // Restores every shard whose version in `registrations` is above
  // `version`; the lowest shard's error.
  absl::Status RestoreAbove(const std::vector<Registration>& registrations, int64_t version);
  // A random job run id: 16 hex digits.
  static std::string NewJobRun();
  // Runs start(shard, local first, local last, done) for every shard whose
  // segments meet [first, last), and `done` once all are done.
  void OnShardSegments(
      const char* what, int first, int last, size_t buffer_size,
      const std::function<void(Shard&, int, int, Done)>& start, Done done);

  ShardedStoreOptions options_;
  ShardPlan plan_;
  std::vector<Shard> shards_;  // the shards taking part, in shard order
  std::unique_ptr<DeviceThreads> threads_;  // one per shard taking part
  int64_t num_parameters_ = 0;
  // Per shard taking part: the index of its first segment in SegmentEnds(),
  // and one past the last shard's last.
  std::vector<int> first_segment_;
  bool registered_ = false;
  Registration registration_;  // the last one, as the caller got it
  std::string job_run_;        // every shard's, once registered
};

}  // namespace ps::worker

#endif  // PS_WORKER_SHARDED_PARAMETER_STORE_H_
