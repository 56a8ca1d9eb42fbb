#include "kernels/batch_norm_cpu.h"

#include <algorithm>
#include <cmath>

namespace ps::kernels::internal {
namespace {

// A chunk of channels gets at least this many elements, so small layers stay
// on one thread.
constexpr int64_t kMinWorkPerChunk = 1 << 15;

int64_t MinChannels(int64_t per_channel) {
  return std::max<int64_t>(1, kMinWorkPerChunk / std::max<int64_t>(1, per_channel));
}

// Calls fn(v) for every element of channel c of x [N, C, S], batch-major.
template <typename Fn>
void ForChannel(const BatchNormShape& s, int64_t c, const float* x, Fn fn) {
  for (int64_t n = 0; n < s.batch; ++n) {
    const float* row = x + (n * s.channels + c) * s.spatial;
    for (int64_t i = 0; i < s.spatial; ++i) fn(row[i]);
  }
}

}  // namespace

void BatchNormForwardTrainingCpu(CpuDevice& device, const BatchNormShape& s, float eps,
                                 float momentum, const float* x, const float* gamma,
                                 const float* beta, float* y, float* save_mean, float* save_inv_std,
                                 float* running_mean, float* running_var) {
  const int64_t m = s.batch * s.spatial;
  device.ParallelFor(s.channels, MinChannels(m), [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      // Two passes (mean, then squared deviations) rather than E[x^2] -
      // E[x]^2, which cancels catastrophically when |mean| >> std.
      double sum = 0;
      ForChannel(s, c, x, [&](float v) { sum += v; });
      const double mean = sum / m;
      double sq = 0;
      ForChannel(s, c, x, [&](float v) { sq += (v - mean) * (v - mean); });
      const double var = sq / m;  // biased: what the batch is normalised with
      const float mean_f = static_cast<float>(mean);
      const float inv_std = static_cast<float>(1.0 / std::sqrt(var + eps));
      save_mean[c] = mean_f;
      save_inv_std[c] = inv_std;
      // Running variance is the unbiased estimate, as in PyTorch (m >= 2 is
      // validated).
      running_mean[c] = static_cast<float>((1.0 - momentum) * running_mean[c] + momentum * mean);
      running_var[c] =
          static_cast<float>((1.0 - momentum) * running_var[c] + momentum * var * m / (m - 1));
      const float scale = gamma[c] * inv_std;
      const float shift = beta[c];
      for (int64_t n = 0; n < s.batch; ++n) {
        const int64_t off = (n * s.channels + c) * s.spatial;
        for (int64_t i = 0; i < s.spatial; ++i) {
          y[off + i] = (x[off + i] - mean_f) * scale + shift;
        }
      }
    }
  });
}

void BatchNormForwardInferenceCpu(CpuDevice& device, const BatchNormShape& s, float eps,
                                  const float* x, const float* gamma, const float* beta,
                                  const float* running_mean, const float* running_var, float* y) {
  const int64_t m = s.batch * s.spatial;
  device.ParallelFor(s.channels, MinChannels(m), [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const float mean = running_mean[c];
      const float scale = gamma[c] * (1.f / std::sqrt(running_var[c] + eps));
      const float shift = beta[c];
      for (int64_t n = 0; n < s.batch; ++n) {
        const int64_t off = (n * s.channels + c) * s.spatial;
        for (int64_t i = 0; i < s.spatial; ++i) {
          y[off + i] = (x[off + i] - mean) * scale + shift;
        }
      }
    }
  });
}

void BatchNormBackwardCpu(CpuDevice& device, const BatchNormShape& s, const float* x,
                          const float* gamma, const float* save_mean, const float* save_inv_std,
                          const float* dy, float* dx, float* dgamma, float* dbeta) {
  const int64_t m = s.batch * s.spatial;
  device.ParallelFor(s.channels, MinChannels(m), [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const double mean = save_mean[c];
      const double inv_std = save_inv_std[c];
      // 1. dbeta = sum dy, dgamma = sum dy * xhat, xhat = (x - mean) * inv_std.
      double sum_dy = 0, sum_dy_xhat = 0;
      for (int64_t n = 0; n < s.batch; ++n) {
        const int64_t off = (n * s.channels + c) * s.spatial;
        for (int64_t i = 0; i < s.spatial; ++i) {
          sum_dy += dy[off + i];
          sum_dy_xhat += dy[off + i] * ((x[off + i] - mean) * inv_std);
        }
      }
      dbeta[c] = static_cast<float>(sum_dy);
      dgamma[c] = static_cast<float>(sum_dy_xhat);
      // 2. dx = gamma * inv_std * (dy - mean(dy) - xhat * mean(dy * xhat)):
      //    the batch statistics' own dependence on x removes the mean and the
      //    xhat-correlated part of dy.
      const float k = static_cast<float>(gamma[c] * inv_std);
      const float mean_dy = static_cast<float>(sum_dy / m);
      const float mean_dy_xhat = static_cast<float>(sum_dy_xhat / m);
      const float mean_f = save_mean[c];
      const float inv_std_f = save_inv_std[c];
      for (int64_t n = 0; n < s.batch; ++n) {
        const int64_t off = (n * s.channels + c) * s.spatial;
        for (int64_t i = 0; i < s.spatial; ++i) {
          const float xhat = (x[off + i] - mean_f) * inv_std_f;
          dx[off + i] = k * (dy[off + i] - mean_dy - xhat * mean_dy_xhat);
        }
      }
    }
  });
}

}  // namespace ps::kernels::internal
