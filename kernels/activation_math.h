#ifndef PS_KERNELS_ACTIVATION_MATH_H_
#define PS_KERNELS_ACTIVATION_MATH_H_

// The scalar activation formulas of the CPU kernels, shared by the
// element-wise activations (activation_cpu.cc) and the fused activation +
// pooling kernels (activation_pool_cpu.cc) so that both compute bit-identical
// values. Branch-free, so loops over them vectorise.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace ps::kernels::internal {

// Written as "x < 0 ? 0 : x" rather than std::max so that NaN propagates, as
// in torch.relu.
inline float Relu(float x) { return x < 0.f ? 0.f : x; }

// exp(x) for x <= 0 without a library call or a branch, so the loops below
// vectorise: Cody-Waite range reduction x = n ln2 + r, |r| <= ln2 / 2, then
// Cephes' degree-6 polynomial for exp(r) (relative error under 2 ulp for
// normal results), scaled by 2^n through exponent bits. The scaling is split
// into two factors 2^(n/2) so that both stay normal numbers and results that
// underflow become denormals or zero as with std::exp. Inputs below -110 are
// clamped: exp(-110) already rounds to zero.
inline float ExpNonPositive(float x) {
  x = std::max(x, -110.0f);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t ni = static_cast<int32_t>(n);
  const int32_t n1 = ni >> 1;  // floor(n / 2)
  const int32_t n2 = ni - n1;
  const int32_t bits1 = (n1 + 127) << 23;
  const int32_t bits2 = (n2 + 127) << 23;
  float scale1, scale2;
  std::memcpy(&scale1, &bits1, sizeof(scale1));
  std::memcpy(&scale2, &bits2, sizeof(scale2));
  return p * scale1 * scale2;
}

// 1 / (1 + exp(-x)) evaluated through e = exp(-|x|) <= 1, which never
// overflows: sigmoid(x) = 1 / (1 + e) for x >= 0 and e / (1 + e) otherwise.
// NaN stays NaN.
inline float Sigmoid(float x) {
  const float e = ExpNonPositive(-std::fabs(x));
  const float inv = 1.f / (1.f + e);
  const float y = x >= 0.f ? inv : e * inv;
  return x != x ? x : y;
}

}  // namespace ps::kernels::internal

#endif  // PS_KERNELS_ACTIVATION_MATH_H_
