#include "common/push_checks.h"

#include "absl/strings/str_cat.h"

namespace ps {

absl::Status CheckPushSamples(int64_t num_samples) {
  if (num_samples < 0 || num_samples > kMaxSamplesPerPush) {
    return absl::InvalidArgumentError(
        absl::StrCat("push claims ", num_samples, " samples; 0 to ", kMaxSamplesPerPush,
                     " (so that the workers' sum cannot overflow)"));
  }
  return absl::OkStatus();
}

absl::Status CheckSameSamples(int64_t num_samples, int64_t claimed, absl::string_view pusher,
                              int64_t iteration) {
  if (claimed >= 0 && num_samples != claimed) {
    return absl::FailedPreconditionError(absl::StrCat("push claims ", num_samples, " samples but ",
                                                      pusher, " claimed ", claimed,
                                                      " earlier in iteration ", iteration));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> CheckGradientValues(F32Pieces values, int64_t first_element,
                                         absl::string_view tensor, bool loss_scaling) {
  float bad = 0.f;
  const int64_t i = FirstNonFinite(values, &bad);
  if (i < 0) return false;
  if (loss_scaling) return true;
  return absl::InvalidArgumentError(absl::StrCat("element ", first_element + i, " of '", tensor,
                                                 "' is ", bad, "; refusing a non-finite value"));
}

}  // namespace ps
