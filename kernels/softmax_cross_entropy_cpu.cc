#include "kernels/softmax_cross_entropy_cpu.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace ps::kernels::internal {
namespace {

// Rows are summed in fixed groups of kRowsPerGroup, then the groups in order,
// so loss_sum does not depend on how ParallelFor splits the work (the thread
// count).
constexpr int64_t kRowsPerGroup = 64;
// A ParallelFor chunk gets at least this many logits.
constexpr int64_t kMinWorkPerChunk = 1 << 15;

// Index of the first maximum of x[0, k).
int64_t FirstArgmax(const float* x, int64_t k) {
  int64_t best = 0;
  for (int64_t j = 1; j < k; ++j) {
    if (x[j] > x[best]) best = j;
  }
  return best;
}

}  // namespace

void SoftmaxCrossEntropyCpu(CpuDevice& device, int64_t batch, int64_t classes, const float* logits,
                            const int32_t* labels, float grad_scale, float* loss_sum,
                            float* correct, float* dlogits) {
  const int64_t groups = (batch + kRowsPerGroup - 1) / kRowsPerGroup;
  std::vector<double> group_loss(groups, 0.0);
  std::vector<int64_t> group_correct(groups, 0);
  const int64_t min_groups = std::max<int64_t>(1, kMinWorkPerChunk / (kRowsPerGroup * classes));
  device.ParallelFor(groups, min_groups, [&](int64_t g_begin, int64_t g_end) {
    for (int64_t g = g_begin; g < g_end; ++g) {
      double loss = 0;
      int64_t hits = 0;
      const int64_t row_end = std::min(batch, (g + 1) * kRowsPerGroup);
      for (int64_t row = g * kRowsPerGroup; row < row_end; ++row) {
        const float* x = logits + row * classes;
        const int32_t label = labels[row];
        const bool valid = label >= 0 && label < classes;
        // 1. the row maximum, subtracted before exponentiating so exp() never
        //    overflows and the largest term is exactly 1.
        const int64_t argmax = FirstArgmax(x, classes);
        const float max = x[argmax];
        // 2. log-sum-exp: log sum_j exp(x_j) = max + log sum_j exp(x_j - max).
        double sum = 0;
        for (int64_t j = 0; j < classes; ++j) sum += std::exp(x[j] - max);
        // 3. -log softmax(x)[label] = lse - x[label].
        if (valid) {
          loss += (double(max) - double(x[label])) + std::log(sum);
          hits += argmax == label ? 1 : 0;
        }
        // 4. d loss / d x_j = softmax(x)_j - [j == label].
        if (dlogits != nullptr) {
          float* d = dlogits + row * classes;
          if (!valid) {
            std::fill(d, d + classes, 0.f);
            continue;
          }
          const float inv_sum = static_cast<float>(1.0 / sum);
          for (int64_t j = 0; j < classes; ++j) {
            const float p = std::exp(x[j] - max) * inv_sum;
            d[j] = grad_scale * (p - (j == label ? 1.f : 0.f));
          }
        }
      }
      group_loss[g] = loss;
      group_correct[g] = hits;
    }
  });
  double total_loss = 0;
  int64_t total_correct = 0;
  for (int64_t g = 0; g < groups; ++g) {
    total_loss += group_loss[g];
    total_correct += group_correct[g];
  }
  *loss_sum = static_cast<float>(total_loss);
  *correct = static_cast<float>(total_correct);
}

void ArgmaxRowsCpu(CpuDevice& device, int64_t batch, int64_t classes, const float* logits,
                   int32_t* predictions) {
  const int64_t min_rows = std::max<int64_t>(1, kMinWorkPerChunk / classes);
  device.ParallelFor(batch, min_rows, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      predictions[row] = static_cast<int32_t>(FirstArgmax(logits + row * classes, classes));
    }
  });
}

}  // namespace ps::kernels::internal
