#ifndef PS_KERNELS_SOFTMAX_CROSS_ENTROPY_H_
#define PS_KERNELS_SOFTMAX_CROSS_ENTROPY_H_

// Fused, numerically stable softmax + cross-entropy over logits [N, K] with
// integer labels [N] (log-sum-exp with the row maximum subtracted).
// Errors: kInvalidArgument for batch < 0 or classes outside [1, 2^31).

#include <cstdint>

#include "absl/status/status.h"
#include "common/device.h"

namespace ps::kernels {

// Writes, all in `device` memory:
//   loss_sum[0]  = sum_i -log softmax(logits_i)[labels_i]   (a SUM, not a mean)
//   correct[0]   = number of rows whose argmax (first maximum) equals the label
//   dlogits      = grad_scale * (softmax(logits) - onehot(labels)), [N, K];
//                  skipped when null.
// With the loss a sum over the shard, shard gradients add up to the full
// batch gradient; the optimizer divides by the global batch size.
// A label outside [0, K) makes the row contribute nothing to loss_sum or
// correct and a zero dlogits row; the data layer rejects such labels before
// they get here.
// Results are deterministic: the CPU sums rows in fixed groups, the CUDA
// version reduces per-block partials in a second pass (no float atomics); on
// CUDA the partials live in scratch slot Device::kScratchSlots - 1.
absl::Status SoftmaxCrossEntropy(Device& device, int64_t batch, int64_t classes,
                                 const float* logits, const int32_t* labels, float grad_scale,
                                 float* loss_sum, float* correct, float* dlogits);

// Writes predictions[i] = argmax of row i of logits [N, K] (first maximum).
absl::Status ArgmaxRows(Device& device, int64_t batch, int64_t classes, const float* logits,
                        int32_t* predictions);

}  // namespace ps::kernels

#endif  // PS_KERNELS_SOFTMAX_CROSS_ENTROPY_H_
