#include "common/optimizer/optimizer.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/sgd_cpu.h"

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

absl::Status ValidateOptimizerOptions(const OptimizerOptions& options) {
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

SgdOptimizer::SgdOptimizer(const OptimizerOptions& options, int64_t num_parameters,
                           CpuDevice* device)
    : options_(options),
      num_parameters_(num_parameters),
      device_(device),
      momentum_(options.sgd.momentum != 0 ? num_parameters : 0, 0.f) {}

absl::StatusOr<std::unique_ptr<SgdOptimizer>> SgdOptimizer::Create(const OptimizerOptions& options,
                                                                   int64_t num_parameters,
                                                                   CpuDevice* device) {
  PS_RETURN_IF_ERROR(ValidateOptimizerOptions(options));
  if (num_parameters < 0) {
    return absl::InvalidArgumentError(absl::StrCat("negative parameter count ", num_parameters));
  }
  return std::unique_ptr<SgdOptimizer>(new SgdOptimizer(options, num_parameters, device));
}

absl::Status SgdOptimizer::Apply(int64_t step, int64_t num_samples,
                                 absl::Span<const float> grad_sum, absl::Span<float> params) {
  if (static_cast<int64_t>(params.size()) != num_parameters_) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer is for ", num_parameters_,
                                                   " parameters, got ", params.size()));
  }
  return ApplyRange(step, num_samples, 0, grad_sum, params);
}

absl::Status SgdOptimizer::ApplyRange(int64_t step, int64_t num_samples, int64_t offset,
                                      absl::Span<const float> grad_sum,
                                      absl::Span<float> params) {
  return ApplyRange(step, num_samples, offset, grad_sum, params, params);
}

absl::Status SgdOptimizer::CheckRange(int64_t num_samples, int64_t offset,
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

kernels::SgdHyper SgdOptimizer::HyperAt(int64_t step) const {
  kernels::SgdHyper hyper = options_.sgd;
  hyper.lr = options_.schedule.LearningRate(options_.sgd.lr, step);
  return hyper;
}

float SgdOptimizer::GradScale(int64_t num_samples, float loss_scale) {
  return 1.f / static_cast<float>(num_samples) / loss_scale;
}

absl::Status SgdOptimizer::ApplyRange(int64_t step, int64_t num_samples, int64_t offset,
                                      absl::Span<const float> grad_sum,
                                      absl::Span<const float> params,
                                      absl::Span<float> params_out, float loss_scale) {
  const int64_t n = static_cast<int64_t>(params.size());
  if (static_cast<int64_t>(grad_sum.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat("gradient has ", grad_sum.size(),
                                                   " elements, parameters ", n));
  }
  PS_RETURN_IF_ERROR(CheckRange(num_samples, offset, params, params_out));
  return kernels::SgdUpdateCpu(*device_, n, HyperAt(step), GradScale(num_samples, loss_scale),
                               grad_sum.data(), params.data(), params_out.data(),
                               momentum_.empty() ? nullptr : momentum_.data() + offset);
}

absl::Status SgdOptimizer::ApplyRangeAdding(int64_t step, int64_t num_samples, int64_t offset,
                                            absl::Span<const float> grad_sum,
                                            F32Pieces last_part,
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
  const kernels::SgdHyper hyper = HyperAt(step);
  float* const momentum = momentum_.empty() ? nullptr : momentum_.data() + offset;
  PS_RETURN_IF_ERROR(kernels::ValidateSgd(n, hyper, momentum));
  // The message's pieces in runs of at most kRunElements, a few runs to a
  // thread (about as much as SgdUpdateCpu gives each of its threads).
  constexpr int64_t kRunElements = 1 << 13;
  const std::vector<F32Run> runs = F32Runs(last_part, kRunElements);
  const float grad_scale = GradScale(num_samples, loss_scale);
  const float* const sum = grad_sum.empty() ? nullptr : grad_sum.data();
  std::atomic<bool> failed{false};
  device_->ParallelFor(static_cast<int64_t>(runs.size()), 4, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const F32Run& run = runs[r];
      // Cannot fail: the arguments were checked above.
      const absl::Status s = kernels::SgdUpdateAddingCpu(
          run.count, hyper, grad_scale, sum != nullptr ? sum + run.first : nullptr, run.data(),
          params.data() + run.first, params_out.data() + run.first,
          momentum != nullptr ? momentum + run.first : nullptr);
      if (!s.ok()) failed = true;
    }
  });
  if (failed) return absl::InternalError("the SGD update of a range failed after its checks");
  return absl::OkStatus();
}

absl::Status SgdOptimizer::RestoreMomentum(absl::Span<const float> momentum) {
  if (momentum.size() != momentum_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a momentum buffer of ", momentum.size(), " elements for an optimizer ",
        momentum_.empty() ? std::string("without momentum")
                          : absl::StrCat("with momentum over ", momentum_.size(), " parameters")));
  }
  std::copy(momentum.begin(), momentum.end(), momentum_.begin());
  return absl::OkStatus();
}

}  // namespace ps
