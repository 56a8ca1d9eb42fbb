#include "server/state_capture.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/optimizer/loss_scale.h"

namespace ps::server {

ServerState CaptureServerState(const ChunkTable& table, const Optimizer* optimizer,
                               const OptimizerOptions& options, int64_t version,
                               int64_t steps_per_epoch, const LossScaleState& loss_scale) {
  ServerState state;
  state.version = version;
  state.steps_per_epoch = std::max<int64_t>(0, steps_per_epoch);
  state.loss_scale = loss_scale.scale;
  state.loss_scale_clean_iterations = loss_scale.clean_iterations;
  state.loss_scale_skipped_iterations = loss_scale.skipped_iterations;
  state.signature = table.layout().signature;
  state.parameters.resize(table.layout().num_parameters);
  table.CopyAll(absl::MakeSpan(state.parameters));
  if (optimizer != nullptr) {
    const absl::Span<const float> momentum = optimizer->momentum();
    state.momentum.assign(momentum.begin(), momentum.end());
  } else if (options.sgd.momentum != 0) {
    state.momentum.assign(table.layout().num_parameters, 0.f);  // no update yet
  }
  return state;
}

absl::Status CheckServerState(const ServerState& state, bool with_momentum,
                              bool dynamic_loss_scale) {
  if (state.version < 0) {
    return absl::InvalidArgumentError(absl::StrCat("a saved state of version ", state.version));
  }
  if (state.signature.empty()) {
    return absl::InvalidArgumentError("a saved state with an empty signature (no parameters)");
  }
  if (state.steps_per_epoch < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a saved state of ", state.steps_per_epoch, " steps per epoch"));
  }
  if (!state.momentum.empty() && state.momentum.size() != state.parameters.size()) {
    return absl::InvalidArgumentError(absl::StrCat("the saved momentum has ",
                                                   state.momentum.size(), " elements, the "
                                                   "parameters ", state.parameters.size()));
  }
  if (with_momentum != !state.momentum.empty()) {
    return absl::InvalidArgumentError(
        with_momentum ? "the saved state has no momentum buffer, but this server's optimizer "
                        "uses momentum"
                      : "the saved state has a momentum buffer, but this server's optimizer "
                        "uses none (--momentum=0)");
  }
  for (size_t i = 0; i < state.momentum.size(); ++i) {
    if (!std::isfinite(state.momentum[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("saved momentum element ", i, " is not finite"));
    }
  }
  if (dynamic_loss_scale && state.loss_scale != 0 &&
      (!IsValidLossScale(state.loss_scale) || state.loss_scale_clean_iterations < 0 ||
       state.loss_scale_skipped_iterations < 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a saved loss scale of ", state.loss_scale, " after ", state.loss_scale_clean_iterations,
        " clean iterations: not a power of two from 2^-24 to 2^24, or a negative count"));
  }
  return absl::OkStatus();
}

std::vector<CaptureRequests::Done> CaptureRequests::TakeAll() {
  std::vector<Done> taken;
  taken.swap(pending_);
  return taken;
}

void CaptureRequests::HoldBackFrom(int64_t first_held) {
  if (first_held_ == kNoLimit) first_held_ = first_held;
}

CaptureRequests::Release CaptureRequests::AtBoundary(int64_t version) {
  Release release;
  if (version < first_held_) return release;
  release.captures = TakeAll();
  first_held_ = kNoLimit;
  release.resume = held_back_;
  held_back_ = false;
  return release;
}

CaptureRequests::Release CaptureRequests::Cancel(int* dropped) {
  *dropped = static_cast<int>(pending_.size());
  pending_.clear();
  first_held_ = kNoLimit;
  Release release;
  release.resume = held_back_;
  held_back_ = false;
  return release;
}

}  // namespace ps::server
