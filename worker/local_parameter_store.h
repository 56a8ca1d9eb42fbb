#ifndef PS_WORKER_LOCAL_PARAMETER_STORE_H_
#define PS_WORKER_LOCAL_PARAMETER_STORE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/cpu_device.h"
#include "common/optimizer/loss_scale.h"
#include "common/optimizer/optimizer.h"
#include "worker/parameter_store.h"

namespace ps::worker {

// The parameter store of single-process training: one worker, and the
// server's optimizer (CreateOptimizer's "sgd", the same update of the same
// sum: with one worker the sum is that worker's gradient) applied in
// process.
//
// Bound to the trainer's buffers (BindBuffers), it keeps no parameters or
// gradients of its own and copies nothing: the parameters are the caller's
// buffer, updated in place, and the gradients are read where backward wrote
// them, so a CPU device's step moves no model bytes between host buffers.
// Unbound, pushes copy the gradient in and pulls copy the parameters out, as
// over a wire. Either way a segment's update is applied when its new
// parameters are first asked for (its pull, a Pull, or its next push), not
// when it is pushed: a layer may push its weight gradients while it still
// reads its weights (push_pull_scheduler.h's EarlyGradientsFrom), and the
// update must not change them under it. Updates are element-wise, so
// applying them per segment in any order gives bit for bit what the server
// gives (Optimizer::ApplyRange).
//
// Every call completes inside the call (`done` runs before it returns).
// Thread-safe, though the protocol has one caller thread.
class LocalParameterStore final : public ParameterStore {
 public:
  // `optimizer_threads` CPU threads run the SGD update. The schedule's
  // steps_per_epoch is the one this worker states at registration.
  // kInvalidArgument for invalid optimizer options, and for any optimizer
  // but "sgd": the store's versions are the trainer's parameters, which
  // "none" (the sum-only server's mean gradient) would overwrite.
  //
  // `loss_scale` (server/optimizer.h), dynamic: the store decides the loss
  // scale as the parameter server does (Registration::loss_scale,
  // LossScale()): each update divides by the scale its iteration was pushed
  // with, and a segment pushed with a value that is not finite is an
  // overflow, not an error: its update is skipped, and the scale halves
  // when the iteration ends (the trainer pushes every segment non-finite
  // then, so the whole step is skipped). kInvalidArgument for invalid
  // optimizer or loss-scale options.
  static absl::StatusOr<std::unique_ptr<LocalParameterStore>> Create(
      const OptimizerOptions& optimizer, int optimizer_threads = 1,
      const LossScaleOptions& loss_scale = {});

  // Rank 0 of 1 at version 0, starting from `proposed`. kInvalidArgument for
  // an empty signature, a tensor that is not F32, or a proposal that is not
  // the model's size; kFailedPrecondition for an epoch schedule without
  // steps per epoch. A second registration with the same signature keeps
  // the store's parameters and version (kFailedPrecondition for another).
  absl::StatusOr<Registration> Register(const std::vector<ParamSpec>& signature,
                                        absl::Span<const float> proposed) override;
  absl::Status Push(int64_t iteration, int64_t num_samples,
                    absl::Span<const float> gradient) override;
  // kFailedPrecondition for a version that does not exist: with one worker
  // it never will by waiting.
  absl::Status WaitForVersion(int64_t version) override;
  // kDeadlineExceeded for a version that does not exist.
  absl::StatusOr<int64_t> Pull(int64_t version, absl::Span<float> params) override;

  // One segment per tensor. A push of segments [first, last) checks them all
  // before taking any (all or nothing): kInvalidArgument for a bad range,
  // buffer size or sample count, or a non-finite value (named);
  // kFailedPrecondition for an iteration that is not the current one,
  // samples that differ from this iteration's earlier pushes, or (bound) a
  // segment whose previous update was never pulled; kAlreadyExists for a
  // segment pushed already in this iteration. A pull of a segment whose
  // version does not exist yet fails at once (kDeadlineExceeded); with one
  // worker it exists as soon as its push returns.
  std::vector<int64_t> SegmentEnds() const override;
  float LossScale() const override {
    absl::MutexLock lock(&mu_);
    return loss_scale_.scale;
  }
  // Loss scaling: the iterations skipped for an overflow.
  int64_t skipped_iterations() const {
    absl::MutexLock lock(&mu_);
    return loss_scale_.skipped_iterations;
  }
  void PushSegments(int64_t iteration, int64_t num_samples, int first, int last,
                    absl::Span<const float> gradient, Done done) override;
  void PullSegments(int64_t version, int first, int last, absl::Span<float> params,
                    Done done) override;

  // Zero copy (parameter_store.h): after registration, with every pushed
  // update pulled. The current parameters are written into `params` once,
  // here; the store's own buffers are freed.
  absl::Status BindBuffers(absl::Span<const float> gradients, absl::Span<float> params) override;

  // The version every segment has reached (pushed counts: it is published).
  int64_t version() const;
  // Model bytes copied by pushes (into the store) and pulls (out of it),
  // since creation: none once bound to the caller's buffers.
  int64_t bytes_copied() const;

 private:
  LocalParameterStore() = default;

  // kInvalidArgument unless [first, last) is a range of segments and `flat`
  // holds the model.
  absl::Status CheckSegmentsLocked(int first, int last, size_t flat_size) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status PushLocked(int64_t iteration, int64_t num_samples, int first, int last,
                          absl::Span<const float> gradient) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Checks segments [first, last) against `version` (kDeadlineExceeded for
  // one not there yet, kInternal for one past it unless `newer_ok`), applies
  // their pending updates and copies them to `params` unless it is the
  // store's own buffer.
  absl::Status PullLocked(int64_t version, int first, int last, absl::Span<float> params,
                          bool newer_ok) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies segment s's pushed update to the parameters, if one is pending.
  absl::Status ApplyPendingLocked(int s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t SegmentBegin(int s) const { return s == 0 ? 0 : segment_ends_[s - 1]; }
  // Unbound: the store's own model-sized gradient buffer, made on first use.
  void EnsureOwnGradientsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Copies segment `s` of the model-sized buffer `from` into `to`, counted
  // in bytes_copied_.
  void CopySegmentLocked(int s, const float* from, float* to) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  OptimizerOptions optimizer_options_;
  std::unique_ptr<CpuDevice> device_;  // runs the update

  mutable absl::Mutex mu_;
  std::unique_ptr<Optimizer> optimizer_ ABSL_GUARDED_BY(mu_);
  std::vector<ParamSpec> signature_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> segment_ends_ ABSL_GUARDED_BY(mu_);  // each tensor's end, flat
  // The parameters and the pushed gradients: the store's own vectors (the
  // gradients' made by the first push that copies), or the caller's buffers
  // once bound.
  std::vector<float> own_params_ ABSL_GUARDED_BY(mu_);
  std::vector<float> own_gradients_ ABSL_GUARDED_BY(mu_);
  absl::Span<float> params_ ABSL_GUARDED_BY(mu_);
  absl::Span<const float> gradients_ ABSL_GUARDED_BY(mu_);
  bool bound_ ABSL_GUARDED_BY(mu_) = false;
  // Per segment: its published version (pushes of iterations < it), and
  // whether the update of the last push is still to be applied, over how
  // many samples.
  std::vector<int64_t> segment_version_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> pending_samples_ ABSL_GUARDED_BY(mu_);
  // Loss scaling: the scale each pending update divides by, whether it is
  // an overflow (skipped), the scale of iteration version_, and whether a
  // segment of it overflowed.
  LossScaleOptions loss_scale_options_;
  std::vector<float> pending_scale_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> pending_overflow_ ABSL_GUARDED_BY(mu_);
  LossScaleState loss_scale_ ABSL_GUARDED_BY(mu_);
  bool iteration_overflow_ ABSL_GUARDED_BY(mu_) = false;
  // The iteration being pushed (every segment has at least it), how many
  // segments have pushed it, and the samples its pushes claim (-1: none yet).
  int64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  int segments_pushed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t iteration_samples_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t bytes_copied_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ps::worker

#endif  // PS_WORKER_LOCAL_PARAMETER_STORE_H_
