#ifndef PS_COMMON_OPTIMIZER_LOSS_SCALE_H_
#define PS_COMMON_OPTIMIZER_LOSS_SCALE_H_

#include <cstdint>

#include "absl/status/status.h"

namespace ps {

// Dynamic loss scaling, for fp16 training (Micikevicius et al. 2018;
// PyTorch's GradScaler): workers multiply their loss by the scale of the
// step before backward, the update divides by it again (a power of two:
// exactly), and a step whose gradient overflows anywhere is skipped. The
// parameter server (and the single-process store) decide it, so that
// workers never diverge.
struct LossScaleOptions {
  bool dynamic = false;
  float initial = 65536.f;  // 2^16, as GradScaler; a power of two
  int64_t growth_interval = 2000;  // clean iterations in a row before it doubles
};

// A scale is a power of two from 2^-24 to 2^24.
inline constexpr float kMinLossScale = 1.f / (1 << 24);
inline constexpr float kMaxLossScale = 1 << 24;
bool IsValidLossScale(float scale);

// kInvalidArgument, naming the field, for an initial scale that is not
// valid or a growth interval below 1 (only checked when dynamic).
absl::Status ValidateLossScaleOptions(const LossScaleOptions& options);

// The scale's state and its rule: after an iteration with an overflow it
// halves, after growth_interval clean iterations in a row it doubles, within
// [kMinLossScale, kMaxLossScale]. scale 0: no loss scaling.
struct LossScaleState {
  float scale = 0;
  int64_t clean_iterations = 0;
  int64_t skipped_iterations = 0;

  static LossScaleState Initial(const LossScaleOptions& options) {
    return {options.dynamic ? options.initial : 0.f, 0, 0};
  }
  // At the end of an iteration (nothing without loss scaling).
  void Advance(bool overflow, int64_t growth_interval);
};

}  // namespace ps

#endif  // PS_COMMON_OPTIMIZER_LOSS_SCALE_H_
