#include "common/optimizer/optimizer.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace ps {

float LrSchedule::LearningRate(float base_lr, int64_t step) const {
  float lr = base_lr;
  if (step_size > 0) {
    const int64_t t = unit == Unit::kSteps ? step : step / std::max<int64_t>(1, steps_per_epoch);
    lr = base_lr * std::pow(gamma, static_cast<float>(t / step_size));
  }
  if (warmup_steps > 0 && step < warmup_steps) {
    lr *= static_cast<float>(step + 1) / static_cast<float>(warmup_steps);
  }
  return lr;
}

absl::StatusOr<LrSchedule::Unit> ParseLrScheduleUnit(absl::string_view text) {
  if (text == "epochs") return LrSchedule::Unit::kEpochs;
  if (text == "steps") return LrSchedule::Unit::kSteps;
  return absl::InvalidArgumentError(
      absl::StrCat("learning-rate decay unit must be epochs or steps, got '", text, "'"));
}

namespace {

absl::Status ValidateSgdOptions(const OptimizerOptions& options) {
  const kernels::SgdHyper& sgd = options.sgd;
  if (!std::isfinite(sgd.lr) || sgd.lr < 0) {
    return absl::InvalidArgumentError(absl::StrCat("learning rate must be >= 0, got ", sgd.lr));
  }
  if (!(sgd.momentum >= 0 && sgd.momentum < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("momentum must be in [0, 1), got ", sgd.momentum));
  }
  if (!std::isfinite(sgd.weight_decay) || sgd.weight_decay < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight decay must be >= 0, got ", sgd.weight_decay));
  }
  if (sgd.nesterov && sgd.momentum == 0) {
    return absl::InvalidArgumentError("nesterov momentum needs momentum > 0");
  }
  if (options.schedule.warmup_steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "learning-rate warm-up needs warmup_steps >= 0, got ", options.schedule.warmup_steps));
  }
  if (options.schedule.step_size < 0 || !(options.schedule.gamma > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "learning-rate schedule needs step_size >= 0 and gamma > 0, got step_size ",
        options.schedule.step_size, ", gamma ", options.schedule.gamma));
  }
  return absl::OkStatus();
}

// "none" applies no SGD: each of SGD's settings must be at its default, or
// the caller meant an update this optimizer does not make.
absl::Status CheckNoSgdSettings(const OptimizerOptions& options) {
  const OptimizerOptions defaults;
  std::vector<std::string> set;
  if (options.sgd.lr != defaults.sgd.lr) set.push_back("lr");
  if (options.sgd.momentum != defaults.sgd.momentum) set.push_back("momentum");
  if (options.sgd.weight_decay != defaults.sgd.weight_decay) set.push_back("weight_decay");
  if (options.sgd.nesterov != defaults.sgd.nesterov) set.push_back("nesterov");
  const LrSchedule& schedule = options.schedule;
  if (schedule.unit != defaults.schedule.unit || schedule.step_size != defaults.schedule.step_size ||
      schedule.gamma != defaults.schedule.gamma) {
    set.push_back("schedule");
  }
  if (schedule.warmup_steps != defaults.schedule.warmup_steps) set.push_back("warmup_steps");
  if (set.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "optimizer '", kMeanGradientOptimizer, "' publishes the mean gradient and applies no SGD, "
      "but SGD settings are given: ", absl::StrJoin(set, ", ")));
}

}  // namespace

absl::Status ValidateOptimizerOptions(const OptimizerOptions& options) {
  if (options.kind == kSgdOptimizer) return ValidateSgdOptions(options);
  if (options.kind == kMeanGradientOptimizer) return CheckNoSgdSettings(options);
  return absl::InvalidArgumentError(absl::StrCat("optimizer '", options.kind, "': use ",
                                                 kSgdOptimizer, " or ", kMeanGradientOptimizer));
}

absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(const OptimizerOptions& options,
                                                           int64_t num_parameters,
                                                           CpuDevice* device) {
  PS_RETURN_IF_ERROR(ValidateOptimizerOptions(options));
  if (num_parameters < 0) {
    return absl::InvalidArgumentError(absl::StrCat("negative parameter count ", num_parameters));
  }
  if (options.kind == kMeanGradientOptimizer) {
    return internal::NewMeanGradient(options, num_parameters, device);
  }
  return internal::NewSgdOptimizer(options, num_parameters, device);
}

Optimizer::Optimizer(const OptimizerOptions& options, int64_t num_parameters, CpuDevice* device)
    : options_(options), num_parameters_(num_parameters), device_(device) {}

absl::Status Optimizer::Apply(int64_t step, int64_t num_samples, absl::Span<const float> grad_sum,
                              absl::Span<float> params) {
  if (static_cast<int64_t>(params.size()) != num_parameters_) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer is for ", num_parameters_,
                                                   " parameters, got ", params.size()));
  }
  return ApplyRange(step, num_samples, 0, grad_sum, params);
}

absl::Status Optimizer::ApplyRange(int64_t step, int64_t num_samples, int64_t offset,
                                   absl::Span<const float> grad_sum, absl::Span<float> params) {
  return ApplyRange(step, num_samples, offset, grad_sum, params, params);
}

absl::Status Optimizer::CheckRange(int64_t num_samples, int64_t offset,
                                   absl::Span<const float> params,
                                   absl::Span<float> params_out) const {
  const int64_t n = static_cast<int64_t>(params.size());
  if (params_out.size() != params.size()) {
    return absl::InvalidArgumentError(absl::StrCat("parameters in of ", params.size(),
                                                   " elements, out of ", params_out.size()));
  }
  // Written so that no overflow can pass: offset + n is formed only once
  // offset is known to be at most num_parameters_.
  if (offset < 0 || offset > num_parameters_ || n > num_parameters_ - offset) {
    return absl::InvalidArgumentError(absl::StrCat(n, " elements at offset ", offset,
                                                   " lie outside the optimizer's ",
                                                   num_parameters_, " parameters"));
  }
  if (num_samples < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("an update must cover at least one sample, got ", num_samples));
  }
  return absl::OkStatus();
}

float Optimizer::GradScale(int64_t num_samples, float loss_scale) {
  return 1.f / static_cast<float>(num_samples) / loss_scale;
}

absl::Status Optimizer::ApplyRange(int64_t step, int64_t num_samples, int64_t offset,
                                   absl::Span<const float> grad_sum,
                                   absl::Span<const float> params,
                                   absl::Span<float> params_out, float loss_scale) {
  const int64_t n = static_cast<int64_t>(params.size());
  if (static_cast<int64_t>(grad_sum.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat("gradient has ", grad_sum.size(),
                                                   " elements, parameters ", n));
  }
  PS_RETURN_IF_ERROR(CheckRange(num_samples, offset, params, params_out));
  return Update(step, GradScale(num_samples, loss_scale), offset, grad_sum, params, params_out);
}

absl::Status Optimizer::ApplyRangeAdding(int64_t step, int64_t num_samples, int64_t offset,
                                         absl::Span<const float> grad_sum, F32Pieces last_part,
                                         absl::Span<const float> params,
                                         absl::Span<float> params_out, float loss_scale) {
  const int64_t n = static_cast<int64_t>(params.size());
  const int64_t last_bytes = PiecesBytes(last_part);
  if (last_bytes != n * static_cast<int64_t>(sizeof(float)) ||
      (!grad_sum.empty() && static_cast<int64_t>(grad_sum.size()) != n)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gradient of ", grad_sum.size(), " elements plus a last part of ", last_bytes,
        " bytes for ", n, " parameters"));
  }
  PS_RETURN_IF_ERROR(CheckRange(num_samples, offset, params, params_out));
  return UpdateAdding(step, GradScale(num_samples, loss_scale), offset, grad_sum, last_part,
                      params, params_out);
}

absl::Status Optimizer::ForEachRunInParallel(
    F32Pieces last_part, const std::function<absl::Status(const F32Run&)>& fn) const {
  // The message's pieces in runs of at most kRunElements, a few runs to a
  // thread (about as much as SgdUpdateCpu gives each of its threads).
  constexpr int64_t kRunElements = 1 << 13;
  const std::vector<F32Run> runs = F32Runs(last_part, kRunElements);
  std::atomic<bool> failed{false};
  device_->ParallelFor(static_cast<int64_t>(runs.size()), 4, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      if (!fn(runs[r]).ok()) failed = true;
    }
  });
  if (failed) {
    return absl::InternalError(
        absl::StrCat("the ", name(), " update of a range failed after its checks"));
  }
  return absl::OkStatus();
}

absl::Status Optimizer::RestoreMomentum(absl::Span<const float> momentum) {
  if (!momentum.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("a momentum buffer of ", momentum.size(),
                                                   " elements for optimizer '", name(),
                                                   "', which keeps none"));
  }
  return absl::OkStatus();
}

}  // namespace ps
