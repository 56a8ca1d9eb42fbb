#include "kernels/activation_pool_cpu.h"

#include <cstdint>
#include <vector>

#include "kernels/activation_math.h"
#include "kernels/pool_plane_cpu.h"

namespace ps::kernels::internal {
namespace {

// The activation (F) and its backward step (D: the gradient g of a = act(x)
// turned into the gradient of x, from a), with activation_cpu.cc's formulas
// and operation order: ReluBackward's "y > 0 ? dy : 0" and SigmoidBackward's
// "dy * y * (1 - y)".
struct ReluOp {
  static float F(float x) { return Relu(x); }
  static float D(float g, float a) { return a > 0.f ? g : 0.f; }
};
struct SigmoidOp {
  static float F(float x) { return Sigmoid(x); }
  static float D(float g, float a) { return g * a * (1.f - a); }
};

// One plane's activation (of x + *bias when bias is not null) in one long
// loop, which vectorises well (sigmoid is compute-bound: ~25 vector
// operations per 8 values). a may alias x.
template <class Act>
void ActivatePlane(const float* x, const float* bias, int64_t n, float* a) {
  if (bias == nullptr) {
    for (int64_t i = 0; i < n; ++i) a[i] = Act::F(x[i]);
    return;
  }
  const float b = *bias;
  for (int64_t i = 0; i < n; ++i) a[i] = Act::F(x[i] + b);
}

template <class Act>
void AvgBackwardPlane(const Pool2dShape& s, const float* ap, const float* dyp, float* dxp,
                      float* grad) {
  AvgPoolBackwardPlane(s, dyp, dxp, grad, [ap](float g, int64_t i) { return Act::D(g, ap[i]); });
}

template <class Act>
void MaxBackwardPlane(const Pool2dShape& s, const float* ap, const float* dyp, const int32_t* mp,
                      float* dxp) {
  MaxPoolBackwardPlane(s, dyp, mp, dxp);
  const int64_t in_plane = s.height * s.width;
  for (int64_t i = 0; i < in_plane; ++i) dxp[i] = Act::D(dxp[i], ap[i]);
}

}  // namespace

// Both plane functions are also compiled for AVX-512 and picked at load time
// (an ifunc): the sigmoid's polynomial runs on twice as many lanes. Same IEEE
// operations in the same order, so results do not depend on the clone.
__attribute__((target_clones("avx512f", "default"), flatten))
void ActivationPoolPlaneForward(PoolActivation act, bool max, const Pool2dShape& s, const float* x,
                                const float* bias, float* a, float* y, int32_t* argmax,
                                float* rows) {
  const int64_t in_plane = s.height * s.width;
  if (act == PoolActivation::kSigmoid) {
    ActivatePlane<SigmoidOp>(x, bias, in_plane, a);
  } else {
    ActivatePlane<ReluOp>(x, bias, in_plane, a);
  }
  if (max) {
    MaxPoolPlane(s, a, y, argmax);
  } else {
    AvgPoolPlane(s, a, y, rows);
  }
}

__attribute__((target_clones("avx512f", "default"), flatten))
void ActivationPoolPlaneBackward(PoolActivation act, bool max, const Pool2dShape& s,
                                 const float* a, const float* dy, const int32_t* argmax,
                                 float* dx, float* rows) {
  if (act == PoolActivation::kSigmoid) {
    if (max) {
      MaxBackwardPlane<SigmoidOp>(s, a, dy, argmax, dx);
    } else {
      AvgBackwardPlane<SigmoidOp>(s, a, dy, dx, rows);
    }
  } else {
    if (max) {
      MaxBackwardPlane<ReluOp>(s, a, dy, argmax, dx);
    } else {
      AvgBackwardPlane<ReluOp>(s, a, dy, dx, rows);
    }
  }
}

namespace {

void ForwardPlanes(CpuDevice& device, PoolActivation act, bool max, const Pool2dShape& s,
                   const float* x, float* a, float* y, int32_t* argmax) {
  const int64_t in_plane = s.height * s.width, out_plane = s.out_height() * s.out_width();
  device.ParallelFor(s.batch * s.channels, MinPlanes(in_plane), [&](int64_t b, int64_t e) {
    std::vector<float> rows(s.width);
    for (int64_t plane = b; plane < e; ++plane) {
      ActivationPoolPlaneForward(act, max, s, x + plane * in_plane, nullptr, a + plane * in_plane,
                                 y + plane * out_plane,
                                 max ? argmax + plane * out_plane : nullptr, rows.data());
    }
  });
}

void BackwardPlanes(CpuDevice& device, PoolActivation act, bool max, const Pool2dShape& s,
                    const float* a, const float* dy, const int32_t* argmax, float* dx) {
  const int64_t in_plane = s.height * s.width, out_plane = s.out_height() * s.out_width();
  device.ParallelFor(s.batch * s.channels, MinPlanes(in_plane), [&](int64_t b, int64_t e) {
    std::vector<float> rows(s.width);
    for (int64_t plane = b; plane < e; ++plane) {
      ActivationPoolPlaneBackward(act, max, s, a + plane * in_plane, dy + plane * out_plane,
                                  max ? argmax + plane * out_plane : nullptr,
                                  dx + plane * in_plane, rows.data());
    }
  });
}

}  // namespace

void ActivationAvgPool2dForwardCpu(CpuDevice& device, PoolActivation act, const Pool2dShape& shape,
                                   const float* x, float* a, float* y) {
  ForwardPlanes(device, act, /*max=*/false, shape, x, a, y, nullptr);
}

void ActivationAvgPool2dBackwardCpu(CpuDevice& device, PoolActivation act,
                                    const Pool2dShape& shape, const float* a, const float* dy,
                                    float* dx) {
  BackwardPlanes(device, act, /*max=*/false, shape, a, dy, nullptr, dx);
}

void ActivationMaxPool2dForwardCpu(CpuDevice& device, PoolActivation act, const Pool2dShape& shape,
                                   const float* x, float* a, float* y, int32_t* argmax) {
  ForwardPlanes(device, act, /*max=*/true, shape, x, a, y, argmax);
}

void ActivationMaxPool2dBackwardCpu(CpuDevice& device, PoolActivation act,
                                    const Pool2dShape& shape, const float* a, const float* dy,
                                    const int32_t* argmax, float* dx) {
  BackwardPlanes(device, act, /*max=*/true, shape, a, dy, argmax, dx);
}

}  // namespace ps::kernels::internal
