#ifndef PS_COMMON_PUSH_CHECKS_H_
#define PS_COMMON_PUSH_CHECKS_H_

// The checks every parameter store makes of a pushed gradient, in one
// place, so that the server (server/parameter_server.h) and the in-process
// store (worker/local_parameter_store.h) refuse the same pushes with the
// same words: a sample count out of range or different from the one the
// same worker claimed earlier in the iteration, and a value that is not
// finite (an overflow, not an error, under dynamic loss scaling).

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/f32_pieces.h"

namespace ps {

// The most samples one push may claim: the sum over the workers (at most
// 2^22 of them) stays inside int64.
inline constexpr int64_t kMaxSamplesPerPush = int64_t{1} << 40;

// kInvalidArgument for a sample count below 0 or above kMaxSamplesPerPush.
absl::Status CheckPushSamples(int64_t num_samples);

// kFailedPrecondition when `num_samples` differs from what `pusher` (e.g.
// "worker rank 2") claimed earlier in `iteration` (`claimed`; -1: nothing
// yet): all of one worker's pushes of an iteration cover the same samples.
absl::Status CheckSameSamples(int64_t num_samples, int64_t claimed, absl::string_view pusher,
                              int64_t iteration);

// Whether the gradient elements in `values` (elements first_element, ... of
// tensor `tensor`) are finite. With `loss_scaling`, a non-finite value is
// an overflow: returns true (the iteration's update of it is skipped).
// Without, it is kInvalidArgument naming the element, the tensor and the
// value.
absl::StatusOr<bool> CheckGradientValues(F32Pieces values, int64_t first_element,
                                         absl::string_view tensor, bool loss_scaling);

}  // namespace ps

#endif  // PS_COMMON_PUSH_CHECKS_H_
