#include "kernels/softmax_cross_entropy.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/dispatch.h"
#include "kernels/softmax_cross_entropy_cpu.h"

#ifdef PS_WITH_CUDA
#include "kernels/softmax_cross_entropy_cuda.h"
#endif

namespace ps::kernels {
namespace {

// The scratch slot holding the CUDA pass's per-block partial sums; the slot
// is only needed while this call's kernels run (see Device::Scratch).
[[maybe_unused]] constexpr int kPartialsSlot = Device::kScratchSlots - 1;

// classes is bounded by int32 because labels and predictions are int32.
absl::Status ValidateSizes(absl::string_view what, int64_t batch, int64_t classes) {
  if (batch < 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": batch = ", batch, " < 0"));
  }
  if (classes < 1 || classes > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": classes = ", classes, " out of range [1, 2^31)"));
  }
  if (batch > std::numeric_limits<int64_t>::max() / classes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": batch * classes = ", batch, " * ", classes, " overflows"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SoftmaxCrossEntropy(Device& device, int64_t batch, int64_t classes,
                                 const float* logits, const int32_t* labels, float grad_scale,
                                 float* loss_sum, float* correct, float* dlogits) {
  if (absl::Status s = ValidateSizes("SoftmaxCrossEntropy", batch, classes); !s.ok()) return s;
  if (device.is_cpu()) {
    internal::SoftmaxCrossEntropyCpu(AsCpu(device), batch, classes, logits, labels, grad_scale,
                                     loss_sum, correct, dlogits);
    return absl::OkStatus();
  }
#ifdef PS_WITH_CUDA
  absl::StatusOr<void*> partials =
      device.Scratch(kPartialsSlot, internal::SoftmaxCrossEntropyCudaScratchBytes(batch));
  if (!partials.ok()) return partials.status();
#endif
  PS_LAUNCH_CUDA(
      device, "SoftmaxCrossEntropy",
      internal::SoftmaxCrossEntropyCuda(stream, batch, classes, logits, labels, grad_scale,
                                        *partials, loss_sum, correct, dlogits));
}

absl::Status ArgmaxRows(Device& device, int64_t batch, int64_t classes, const float* logits,
                        int32_t* predictions) {
  if (absl::Status s = ValidateSizes("ArgmaxRows", batch, classes); !s.ok()) return s;
  if (device.is_cpu()) {
    internal::ArgmaxRowsCpu(AsCpu(device), batch, classes, logits, predictions);
    return absl::OkStatus();
  }
  PS_LAUNCH_CUDA(device, "ArgmaxRows",
                 internal::ArgmaxRowsCuda(stream, batch, classes, logits, predictions));
}

}  // namespace ps::kernels
