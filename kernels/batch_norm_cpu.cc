#include "kernels/batch_norm_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace ps::kernels::internal {
namespace {

// A chunk of channels gets at least this many elements, so small layers stay
// on one thread.
constexpr int64_t kMinWorkPerChunk = 1 << 15;

int64_t MinChannels(int64_t per_channel) {
  return std::max<int64_t>(1, kMinWorkPerChunk / std::max<int64_t>(1, per_channel));
}

// The channel statistics are sums in double over one row (a sample's plane)
// at a time. GCC keeps a double reduction in order (no -ffast-math), one
// dependent add after another, 4 cycles each; these sum four lanes of two
// vectors side by side instead, so eight adds are in flight. (ResNet-18 at
// batch 256 spent 11% of its step in the in-order loops.)
typedef float Vec4f __attribute__((vector_size(16)));
typedef double Vec4d __attribute__((vector_size(32)));

inline Vec4d Load4(const float *p) {
  Vec4f v;
  std::memcpy(&v, p, sizeof(v));  // unaligned
  return __builtin_convertvector(v, Vec4d);
}

inline double Lanes(Vec4d a, Vec4d b) {
  const Vec4d v = a + b;
  return (v[0] + v[1]) + (v[2] + v[3]);
}

// sum of p[0, n).
double RowSum(const float *p, int64_t n) {
  Vec4d a = {0, 0, 0, 0}, b = a;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    a += Load4(p + i);
    b += Load4(p + i + 4);
  }
  double sum = Lanes(a, b);
  for (; i < n; ++i) sum += p[i];
  return sum;
}

// sum of (p[i] - mean)^2 over [0, n).
double RowSquaredDeviations(const float *p, int64_t n, double mean) {
  Vec4d a = {0, 0, 0, 0}, b = a;
  const Vec4d m = {mean, mean, mean, mean};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const Vec4d u = Load4(p + i) - m, v = Load4(p + i + 4) - m;
    a += u * u;
    b += v * v;
  }
  double sum = Lanes(a, b);
  for (; i < n; ++i) sum += (p[i] - mean) * (p[i] - mean);
  return sum;
}

// Adds sum dy[i] to *sum_dy and sum dy[i] * (x[i] - mean) * inv_std to
// *sum_dy_xhat, over [0, n).
void AddRowGradientSums(const float *dy, const float *x, int64_t n, double mean, double inv_std,
                        double *sum_dy, double *sum_dy_xhat) {
  Vec4d a = {0, 0, 0, 0}, b = a, c = a, d = a;
  const Vec4d m = {mean, mean, mean, mean}, k = {inv_std, inv_std, inv_std, inv_std};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const Vec4d g0 = Load4(dy + i), g1 = Load4(dy + i + 4);
    a += g0;
    b += g1;
    c += g0 * ((Load4(x + i) - m) * k);
    d += g1 * ((Load4(x + i + 4) - m) * k);
  }
  double s1 = Lanes(a, b), s2 = Lanes(c, d);
  for (; i < n; ++i) {
    s1 += dy[i];
    s2 += dy[i] * ((x[i] - mean) * inv_std);
  }
  *sum_dy += s1;
  *sum_dy_xhat += s2;
}

}  // namespace

void BatchNormForwardTrainingCpu(CpuDevice &device, const BatchNormShape &s, float eps,
                                 float momentum, const float *x, const float *gamma,
                                 const float *beta, float *y, float *save_mean, float *save_inv_std,
                                 float *running_mean, float *running_var) {
  const int64_t m = s.batch * s.spatial;
  device.ParallelFor(s.channels, MinChannels(m), [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      // Two passes (mean, then squared deviations) rather than E[x^2] -
      // E[x]^2, which cancels catastrophically when |mean| >> std.
      double sum = 0;
      for (int64_t n = 0; n < s.batch; ++n)
        sum += RowSum(x + (n * s.channels + c) * s.spatial, s.spatial);
      const double mean = sum / m;
      double sq = 0;
      for (int64_t n = 0; n < s.batch; ++n) {
        sq += RowSquaredDeviations(x + (n * s.channels + c) * s.spatial, s.spatial, mean);
      }
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

void BatchNormForwardInferenceCpu(CpuDevice &device, const BatchNormShape &s, float eps,
                                  const float *x, const float *gamma, const float *beta,
                                  const float *running_mean, const float *running_var, float *y) {
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

void BatchNormBackwardCpu(CpuDevice &device, const BatchNormShape &s, const float *x,
                          const float *gamma, const float *save_mean, const float *save_inv_std,
                          const float *dy, float *dx, float *dgamma, float *dbeta) {
  const int64_t m = s.batch * s.spatial;
  device.ParallelFor(s.channels, MinChannels(m), [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const double mean = save_mean[c];
      const double inv_std = save_inv_std[c];
      // 1. dbeta = sum dy, dgamma = sum dy * xhat, xhat = (x - mean) *
      // inv_std.
      double sum_dy = 0, sum_dy_xhat = 0;
      for (int64_t n = 0; n < s.batch; ++n) {
        const int64_t off = (n * s.channels + c) * s.spatial;
        AddRowGradientSums(dy + off, x + off, s.spatial, mean, inv_std, &sum_dy, &sum_dy_xhat);
      }
      dbeta[c] = static_cast<float>(sum_dy);
      dgamma[c] = static_cast<float>(sum_dy_xhat);
      // 2. dx = gamma * inv_std * (dy - mean(dy) - xhat * mean(dy * xhat)):
      //    the batch statistics' own dependence on x removes the mean and
      //    the xhat-correlated part of dy.
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
