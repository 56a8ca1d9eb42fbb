#ifndef PS_COMMON_OPTIMIZER_OPTIMIZER_H_
#define PS_COMMON_OPTIMIZER_OPTIMIZER_H_

#include <cstdint>
#include <memory>

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

struct OptimizerOptions {
  kernels::SgdHyper sgd;  // sgd.lr is the base learning rate
  LrSchedule schedule;
};

// kInvalidArgument naming the field for a negative or non-finite rate,
// momentum outside [0, 1), negative weight decay, gamma <= 0, nesterov
// without momentum.
absl::Status ValidateOptimizerOptions(const OptimizerOptions& options);

// SGD over one flat parameter vector in host memory: the update the server
// applies to the sum of all workers' gradients, to the whole vector at once
// (Apply) or to one range of it at a time (ApplyRange, as each chunk's sum
// completes). Holds the momentum buffer. ApplyRange calls over disjoint
// ranges may run at once, each touching only its range, as far as the
// device allows: a CpuDevice of several threads runs one ParallelFor at a
// time, so the caller serialises kernels on it; Apply, and calls over
// overlapping ranges, the caller serialises.
class SgdOptimizer {
 public:
  // `device` runs the update kernel (a CPU device; its threads split the
  // work) and must outlive the optimizer.
  static absl::StatusOr<std::unique_ptr<SgdOptimizer>> Create(const OptimizerOptions& options,
                                                              int64_t num_parameters,
                                                              CpuDevice* device);

  // Applies update number `step` (0-based, selects the learning rate) to
  // `params`, where `grad_sum` is the gradient of the loss summed over
  // `num_samples` samples: the step is that of the mean loss. kInvalidArgument
  // for a size mismatch or num_samples < 1; nothing is changed then.
  absl::Status Apply(int64_t step, int64_t num_samples, absl::Span<const float> grad_sum,
                     absl::Span<float> params);

  // Applies update number `step` to elements [offset, offset + n) of the
  // flat vector only, n = params.size(): `params` and `grad_sum` hold just
  // those elements, and the momentum buffer is read and written at `offset`.
  // The update is element-wise, so ranges that tile the vector, in any order
  // and each applied once per step, give bit for bit what Apply gives.
  // kInvalidArgument, changing nothing, for grad_sum and params of different
  // sizes, a range outside [0, num_parameters) or num_samples < 1.
  absl::Status ApplyRange(int64_t step, int64_t num_samples, int64_t offset,
                          absl::Span<const float> grad_sum, absl::Span<float> params);
  // The same, out of place: reads `params_in`, writes the updated values to
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

  const OptimizerOptions& options() const { return options_; }
  int64_t num_parameters() const { return num_parameters_; }
  // The momentum buffer (empty without momentum), for checkpoints.
  absl::Span<const float> momentum() const { return momentum_; }
  // Sets the momentum buffer from a checkpoint: `momentum` must have
  // num_parameters() elements with momentum, none without
  // (kInvalidArgument otherwise, changing nothing). Not concurrent with
  // updates.
  absl::Status RestoreMomentum(absl::Span<const float> momentum);

 private:
  SgdOptimizer(const OptimizerOptions& options, int64_t num_parameters, CpuDevice* device);

  // ApplyRange's checks of everything but the gradient's size.
  absl::Status CheckRange(int64_t num_samples, int64_t offset, absl::Span<const float> params_in,
                          absl::Span<float> params_out) const;
  // Update `step`'s hyperparameters (the learning rate of its schedule) and
  // the factor on the summed gradient, the same for every way of applying
  // it so that they give the same bits.
  kernels::SgdHyper HyperAt(int64_t step) const;
  static float GradScale(int64_t num_samples, float loss_scale);

  const OptimizerOptions options_;
  const int64_t num_parameters_;
  CpuDevice* const device_;
  std::vector<float> momentum_;
};

}  // namespace ps

#endif  // PS_COMMON_OPTIMIZER_OPTIMIZER_H_
