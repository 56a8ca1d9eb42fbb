// "sgd": PyTorch's torch.optim.SGD (dampening 0) with weight decay,
// momentum, Nesterov's variant, a step learning-rate schedule and linear
// warm-up (kernels/sgd_hyper.h states the update), on the gradient summed
// over the global batch times 1 / num_samples. Each version is the
// parameters. Holds the momentum buffer (with momentum), which checkpoints
// save.

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/optimizer/optimizer.h"
#include "common/status_macros.h"
#include "kernels/sgd_cpu.h"

namespace ps {
namespace {

class SgdOptimizer final : public Optimizer {
 public:
  SgdOptimizer(const OptimizerOptions& options, int64_t num_parameters, CpuDevice* device)
      : Optimizer(options, num_parameters, device),
        momentum_(options.sgd.momentum != 0 ? num_parameters : 0, 0.f) {}

  Output output() const override { return Output::kParameters; }
  absl::Span<const float> momentum() const override { return momentum_; }
  absl::Status RestoreMomentum(absl::Span<const float> momentum) override;

 private:
  absl::Status Update(int64_t step, float grad_scale, int64_t offset,
                      absl::Span<const float> grad_sum, absl::Span<const float> params_in,
                      absl::Span<float> params_out) override;
  absl::Status UpdateAdding(int64_t step, float grad_scale, int64_t offset,
                            absl::Span<const float> grad_sum, F32Pieces last_part,
                            absl::Span<const float> params_in,
                            absl::Span<float> params_out) override;

  // Update `step`'s hyperparameters (the learning rate of its schedule),
  // the same for every way of applying it so that they give the same bits.
  kernels::SgdHyper HyperAt(int64_t step) const {
    kernels::SgdHyper hyper = options().sgd;
    hyper.lr = options().schedule.LearningRate(options().sgd.lr, step);
    return hyper;
  }
  float* MomentumAt(int64_t offset) {
    return momentum_.empty() ? nullptr : momentum_.data() + offset;
  }

  std::vector<float> momentum_;
};

absl::Status SgdOptimizer::Update(int64_t step, float grad_scale, int64_t offset,
                                  absl::Span<const float> grad_sum,
                                  absl::Span<const float> params_in,
                                  absl::Span<float> params_out) {
  return kernels::SgdUpdateCpu(device(), static_cast<int64_t>(params_in.size()), HyperAt(step),
                               grad_scale, grad_sum.data(), params_in.data(), params_out.data(),
                               MomentumAt(offset));
}

absl::Status SgdOptimizer::UpdateAdding(int64_t step, float grad_scale, int64_t offset,
                                        absl::Span<const float> grad_sum, F32Pieces last_part,
                                        absl::Span<const float> params_in,
                                        absl::Span<float> params_out) {
  const int64_t n = static_cast<int64_t>(params_in.size());
  const kernels::SgdHyper hyper = HyperAt(step);
  float* const momentum = MomentumAt(offset);
  PS_RETURN_IF_ERROR(kernels::ValidateSgd(n, hyper, momentum));
  const float* const sum = grad_sum.empty() ? nullptr : grad_sum.data();
  return ForEachRunInParallel(last_part, [&](const F32Run& run) {
    return kernels::SgdUpdateAddingCpu(
        run.count, hyper, grad_scale, sum != nullptr ? sum + run.first : nullptr, run.data(),
        params_in.data() + run.first, params_out.data() + run.first,
        momentum != nullptr ? momentum + run.first : nullptr);
  });
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

}  // namespace

namespace internal {

std::unique_ptr<Optimizer> NewSgdOptimizer(const OptimizerOptions& options,
                                           int64_t num_parameters, CpuDevice* device) {
  return std::make_unique<SgdOptimizer>(options, num_parameters, device);
}

}  // namespace internal
}  // namespace ps
