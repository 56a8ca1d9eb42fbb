#include "server/parameter_server_options.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ps::server {

absl::Status ValidateParameterServerOptions(const ParameterServerOptions& options) {
  if (options.num_workers < 1 || options.num_workers > kMaxWorkers) {
    return absl::InvalidArgumentError(absl::StrCat("num_workers must be 1 to ", kMaxWorkers,
                                                   ", got ", options.num_workers));
  }
  if (options.chunk_elements < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_elements must be >= 1, got ", options.chunk_elements));
  }
  if (options.observer != nullptr && options.clock == nullptr) {
    return absl::InvalidArgumentError("an event observer needs a clock");
  }
  if (options.consistency == nullptr) {
    return absl::InvalidArgumentError("no consistency policy (server/consistency/consistency.h)");
  }
  PS_RETURN_IF_ERROR(ValidateOptimizerOptions(options.optimizer));
  PS_RETURN_IF_ERROR(ValidateLossScaleOptions(options.loss_scale));
  if (options.loss_scale.dynamic && !options.consistency->SupportsLossScaling()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dynamic loss scaling needs sync consistency, not ", options.consistency->Name()));
  }
  if (options.optimizer.kind == kMeanGradientOptimizer) {
    PS_RETURN_IF_ERROR(CheckSumOnlyMode(*options.consistency, options.loss_scale.dynamic));
  }
  return absl::OkStatus();
}

absl::Status CheckSumOnlyMode(const Consistency& consistency, bool dynamic_loss_scale) {
  // Each version must be the mean gradient of one whole iteration.
  if (consistency.AppliesEachPush()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the optimizer none (--optimizer=none) cannot run under ", consistency.Name(),
        " consistency: each push would be published alone, one worker's gradient instead of "
        "the mean over the global batch; use --consistency=sync or ssp:S"));
  }
  if (dynamic_loss_scale) {
    return absl::InvalidArgumentError(
        "the optimizer none (--optimizer=none) cannot run with dynamic loss scaling "
        "(--loss_scale=dynamic): an iteration skipped for an overflow would publish the previous "
        "iteration's mean gradient again, which every worker would apply a second time; leave "
        "loss scaling to the workers' own optimizer");
  }
  return absl::OkStatus();
}

}  // namespace ps::server
