#ifndef PS_COMMON_OPTIMIZER_OPTIMIZER_H_
#define PS_COMMON_OPTIMIZER_OPTIMIZER_H_

// What the owner of the parameters (the parameter server; a worker's
// in-process store) does with the workers' summed gradient: the optimizer.
// One interface, one file per implementation (sgd.cc, mean_gradient.cc),
// and CreateOptimizer the only place that knows their names. The server and
// the in-process store link the same code, so a job trained alone and one
// trained through the server apply bit-identical updates.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/cpu_device.h"
#include "common/f32_pieces.h"
#include "kernels/sgd_hyper.h"

namespace ps {

// Step learning-rate decay: lr = base_lr * gamma^floor(t / step_size), where t
// counts updates (unit kSteps) or completed epochs (unit kEpochs, using
// steps_per_epoch). step_size 0 keeps the rate constant.
//
// Linear warm-up (Goyal et al. 2017, "Accurate, Large Minibatch SGD"): for
// a large global batch the base rate follows the linear scaling rule (k
// times the batch, k times the rate), and the first warmup_steps updates
// ramp up to it: update s (0-based) of those uses (s + 1) / warmup_steps of
// the decayed rate, so update warmup_steps - 1 is the first at full rate.
// warmup_steps 0: no warm-up.
struct LrSchedule {
  enum class Unit { kSteps, kEpochs };
  Unit unit = Unit::kEpochs;
  int64_t step_size = 0;
  float gamma = 0.1f;
  int64_t steps_per_epoch = 1;  // used with kEpochs
  int64_t warmup_steps = 0;

  // The rate for update number `step` (0-based).
  float LearningRate(float base_lr, int64_t step) const;
};

// "epochs" or "steps"; kInvalidArgument names anything else.
absl::StatusOr<LrSchedule::Unit> ParseLrScheduleUnit(absl::string_view text);

// The optimizers, as OptimizerOptions::kind, the server's --optimizer and
// RegisterReply.optimizer spell them.
//   "sgd"  (sgd.cc): SGD with momentum, weight decay, Nesterov, a schedule
//          and warm-up; each version is the parameters.
//   "none" (mean_gradient.cc): no update; each version after 0 is the mean
//          gradient of its iteration's global batch, for workers that apply
//          an optimizer of their own (a sum-only server).
inline constexpr char kSgdOptimizer[] = "sgd";
inline constexpr char kMeanGradientOptimizer[] = "none";

struct OptimizerOptions {
  std::string kind = kSgdOptimizer;
  // SGD's settings: "sgd" only. "none" takes them at their defaults
  // (ValidateOptimizerOptions), so that no setting is silently ignored.
  kernels::SgdHyper sgd;  // sgd.lr is the base learning rate
  LrSchedule schedule;
};

// kInvalidArgument naming the field: an unknown kind; for "sgd" a negative
// or non-finite rate, momentum outside [0, 1), negative weight decay,
// gamma <= 0, nesterov without momentum; for "none" any SGD setting (sgd,
// or the schedule other than steps_per_epoch) away from its default.
absl::Status ValidateOptimizerOptions(const OptimizerOptions& options);

// One optimizer over one flat vector of num_parameters() elements in host
// memory. Each update reads the gradient summed over `num_samples` samples
// (the step is that of the mean loss) and writes the new values of a range
// of the vector, out of place or in place: the whole vector at once
// (Apply) or one range at a time (ApplyRange, as each chunk's sum
// completes). Updates are element-wise, so ranges that tile the vector, in
// any order and each applied once per step, give bit for bit what Apply
// gives.
//
// Every entry point makes the same checks here, before an implementation
// runs: kInvalidArgument, changing nothing, for a gradient, input and
// output of different sizes, a range outside [0, num_parameters()) or
// num_samples < 1.
//
// Threads: calls over disjoint ranges may run at once, each touching only
// its range (of the output and of any state, such as SGD's momentum), as
// far as the device allows: a CpuDevice of several threads runs one
// ParallelFor at a time, so the caller serialises kernels on it. Apply,
// calls over overlapping ranges and RestoreMomentum the caller serialises.
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // What a version holds once an update has written it.
  enum class Output {
    kParameters,    // the parameters after the update ("sgd")
    kMeanGradient,  // the iteration's mean gradient ("none")
  };
  virtual Output output() const = 0;

  // The kind, as OptimizerOptions::kind spells it.
  const std::string& name() const { return options_.kind; }
  const OptimizerOptions& options() const { return options_; }
  int64_t num_parameters() const { return num_parameters_; }

  // Applies update number `step` (0-based; the schedule's step) to the
  // whole vector `params` (num_parameters() elements), in place.
  absl::Status Apply(int64_t step, int64_t num_samples, absl::Span<const float> grad_sum,
                     absl::Span<float> params);

  // Applies update number `step` to elements [offset, offset + n) of the
  // flat vector only, n = params.size(): `params` and `grad_sum` hold just
  // those elements, and any state is read and written at `offset`.
  absl::Status ApplyRange(int64_t step, int64_t num_samples, int64_t offset,
                          absl::Span<const float> grad_sum, absl::Span<float> params);
  // The same, out of place: reads `params_in`, writes the new values to
  // `params_out` (the same size; they may be the same memory), bit for bit.
  // `loss_scale` (a power of two, 1 without loss scaling) is what the
  // workers multiplied their loss by: the gradient is divided by it too,
  // exactly (a power of two), in the same multiply as 1 / num_samples.
  absl::Status ApplyRange(int64_t step, int64_t num_samples, int64_t offset,
                          absl::Span<const float> grad_sum, absl::Span<const float> params_in,
                          absl::Span<float> params_out, float loss_scale = 1.f);

  // The same update with the gradient grad_sum + last_part, element by
  // element: `last_part` (little-endian floats in pieces of any length and
  // alignment, a received message read in place) is the sum's last term,
  // and an empty grad_sum stands for a sum not started (the gradient is then
  // 0 + last_part). Bit for bit what adding last_part into grad_sum (or
  // AssignPiecesTo) and then ApplyRange gives, without writing the sum and
  // reading it back. The same errors, and kInvalidArgument for a last_part
  // or a non-empty grad_sum of other than n elements.
  absl::Status ApplyRangeAdding(int64_t step, int64_t num_samples, int64_t offset,
                                absl::Span<const float> grad_sum, F32Pieces last_part,
                                absl::Span<const float> params_in, absl::Span<float> params_out,
                                float loss_scale = 1.f);

  // The state a checkpoint keeps: the momentum buffer (num_parameters()
  // elements), or empty for an optimizer without one.
  virtual absl::Span<const float> momentum() const { return {}; }
  // Sets it from a checkpoint: `momentum` must be as large as momentum()
  // (kInvalidArgument otherwise, changing nothing).
  virtual absl::Status RestoreMomentum(absl::Span<const float> momentum);

 protected:
  // `device` runs the update kernels (a CPU device; its threads split the
  // work) and must outlive the optimizer.
  Optimizer(const OptimizerOptions& options, int64_t num_parameters, CpuDevice* device);

  CpuDevice& device() const { return *device_; }

  // Calls fn(run) for the runs of `last_part` (F32Runs, a few thousand
  // elements each, a few runs to a thread) in parallel on the device;
  // kInternal when any call fails (the implementations' kernels fail only
  // on what the checks have excluded).
  absl::Status ForEachRunInParallel(F32Pieces last_part,
                                    const std::function<absl::Status(const F32Run&)>& fn) const;

 private:
  // The implementations' update of elements [offset, offset + n), n =
  // params_in.size(), once every check above has passed: `grad_scale` is
  // 1 / num_samples / loss_scale, rounded to float once (GradScale), the
  // factor on the summed gradient.
  virtual absl::Status Update(int64_t step, float grad_scale, int64_t offset,
                              absl::Span<const float> grad_sum, absl::Span<const float> params_in,
                              absl::Span<float> params_out) = 0;
  // The same with the gradient grad_sum + last_part (grad_sum empty: 0 +
  // last_part), last_part of n elements.
  virtual absl::Status UpdateAdding(int64_t step, float grad_scale, int64_t offset,
                                    absl::Span<const float> grad_sum, F32Pieces last_part,
                                    absl::Span<const float> params_in,
                                    absl::Span<float> params_out) = 0;

  // The checks of every entry point but the gradient's size.
  absl::Status CheckRange(int64_t num_samples, int64_t offset, absl::Span<const float> params_in,
                          absl::Span<float> params_out) const;
  static float GradScale(int64_t num_samples, float loss_scale);

  const OptimizerOptions options_;
  const int64_t num_parameters_;
  CpuDevice* const device_;
};

// The optimizer `options.kind` names, over `num_parameters` elements, run
// on `device` (which must outlive it). kInvalidArgument for options that
// ValidateOptimizerOptions refuses or a negative parameter count.
absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(const OptimizerOptions& options,
                                                           int64_t num_parameters,
                                                           CpuDevice* device);

namespace internal {
// The implementations, for CreateOptimizer alone (options validated).
std::unique_ptr<Optimizer> NewSgdOptimizer(const OptimizerOptions& options,
                                           int64_t num_parameters, CpuDevice* device);
std::unique_ptr<Optimizer> NewMeanGradient(const OptimizerOptions& options,
                                           int64_t num_parameters, CpuDevice* device);
}  // namespace internal

}  // namespace ps

#endif  // PS_COMMON_OPTIMIZER_OPTIMIZER_H_
