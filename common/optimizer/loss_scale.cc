#include "common/optimizer/loss_scale.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace ps {

bool IsValidLossScale(float scale) {
  int exponent = 0;
  return scale >= kMinLossScale && scale <= kMaxLossScale && std::frexp(scale, &exponent) == 0.5f;
}

absl::Status ValidateLossScaleOptions(const LossScaleOptions& options) {
  if (!options.dynamic) return absl::OkStatus();
  if (!IsValidLossScale(options.initial)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the initial loss scale must be a power of two from 2^-24 to 2^24, got ",
        options.initial));
  }
  if (options.growth_interval < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the loss scale's growth interval must be >= 1, got ", options.growth_interval));
  }
  return absl::OkStatus();
}

void LossScaleState::Advance(bool overflow, int64_t growth_interval) {
  if (scale == 0) return;
  if (overflow) {
    ++skipped_iterations;
    clean_iterations = 0;
    scale = std::max(kMinLossScale, scale / 2);
  } else if (++clean_iterations >= growth_interval) {
    clean_iterations = 0;
    scale = std::min(kMaxLossScale, scale * 2);
  }
}

}  // namespace ps
