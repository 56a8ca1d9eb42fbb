#include "kernels/activation_pool_cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/activation_math.h"

namespace ps::kernels::internal {
namespace {

// Work is split by (n, c) planes, as in pool_cpu.cc.
constexpr int64_t kMinWorkPerChunk = 1 << 15;

int64_t MinPlanes(int64_t plane_elements) {
  return std::max<int64_t>(1, kMinWorkPerChunk / std::max<int64_t>(1, plane_elements));
}

inline void OutputsCovering(int64_t i, int64_t kernel, int64_t stride, int64_t pad,
                            int64_t out_size, int64_t* begin, int64_t* end) {
  const int64_t p = i + pad;
  *begin = p < kernel ? 0 : (p - kernel) / stride + 1;
  *end = std::min(p / stride + 1, out_size);
}

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

bool NonOverlapping(const Pool2dShape& s) {
  return s.stride_h == s.kernel_h && s.stride_w == s.kernel_w && s.pad_h == 0 && s.pad_w == 0;
}

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

// Average pooling of one activated plane ap into yp.
void AvgPoolPlane(const Pool2dShape& s, const float* ap, float* yp, float* rows) {
  const int64_t oh_n = s.out_height(), ow_n = s.out_width();
  const float inv_count = 1.f / static_cast<float>(s.kernel_h * s.kernel_w);
  if (NonOverlapping(s)) {
    // pool_cpu.cc's fast path: a window's rows summed into a row buffer, then
    // its column groups (unrolled for LeNet's width-2 windows).
    for (int64_t oh = 0; oh < oh_n; ++oh) {
      const float* first = ap + oh * s.kernel_h * s.width;
      for (int64_t w = 0; w < s.width; ++w) rows[w] = first[w];
      for (int64_t k = 1; k < s.kernel_h; ++k) {
        const float* row = first + k * s.width;
        for (int64_t w = 0; w < s.width; ++w) rows[w] += row[w];
      }
      float* yr = yp + oh * ow_n;
      if (s.kernel_w == 2) {
        for (int64_t ow = 0; ow < ow_n; ++ow) {
          yr[ow] = (0.f + rows[2 * ow] + rows[2 * ow + 1]) * inv_count;
        }
      } else {
        for (int64_t ow = 0; ow < ow_n; ++ow) {
          float sum = 0.f;
          for (int64_t k = 0; k < s.kernel_w; ++k) sum += rows[ow * s.kernel_w + k];
          yr[ow] = sum * inv_count;
        }
      }
    }
    return;
  }
  for (int64_t oh = 0; oh < oh_n; ++oh) {
    const int64_t h0 = std::max<int64_t>(oh * s.stride_h - s.pad_h, 0);
    const int64_t h1 = std::min(oh * s.stride_h - s.pad_h + s.kernel_h, s.height);
    for (int64_t ow = 0; ow < ow_n; ++ow) {
      const int64_t w0 = std::max<int64_t>(ow * s.stride_w - s.pad_w, 0);
      const int64_t w1 = std::min(ow * s.stride_w - s.pad_w + s.kernel_w, s.width);
      float sum = 0.f;
      for (int64_t h = h0; h < h1; ++h) {
        for (int64_t w = w0; w < w1; ++w) sum += ap[h * s.width + w];
      }
      yp[oh * ow_n + ow] = sum * inv_count;
    }
  }
}

// Max pooling of one activated plane, as MaxPool2dForwardCpu: first maximum
// wins, NaN propagates.
void MaxPoolPlane(const Pool2dShape& s, const float* ap, float* yp, int32_t* mp) {
  const int64_t oh_n = s.out_height(), ow_n = s.out_width();
  for (int64_t oh = 0; oh < oh_n; ++oh) {
    const int64_t h0 = std::max<int64_t>(oh * s.stride_h - s.pad_h, 0);
    const int64_t h1 = std::min(oh * s.stride_h - s.pad_h + s.kernel_h, s.height);
    for (int64_t ow = 0; ow < ow_n; ++ow) {
      const int64_t w0 = std::max<int64_t>(ow * s.stride_w - s.pad_w, 0);
      const int64_t w1 = std::min(ow * s.stride_w - s.pad_w + s.kernel_w, s.width);
      int64_t best = h0 * s.width + w0;
      float best_v = -std::numeric_limits<float>::infinity();
      for (int64_t h = h0; h < h1; ++h) {
        for (int64_t w = w0; w < w1; ++w) {
          const float v = ap[h * s.width + w];
          if (v > best_v || std::isnan(v)) {
            best_v = v;
            best = h * s.width + w;
          }
        }
      }
      yp[oh * ow_n + ow] = best_v;
      mp[oh * ow_n + ow] = static_cast<int32_t>(best);
    }
  }
}

template <class Act>
void AvgBackwardPlane(const Pool2dShape& s, const float* ap, const float* dyp, float* dxp,
                      float* grad) {
  const int64_t oh_n = s.out_height(), ow_n = s.out_width();
  const int64_t in_plane = s.height * s.width;
  const float inv_count = 1.f / static_cast<float>(s.kernel_h * s.kernel_w);
  if (NonOverlapping(s)) {
    // Each window row's pooled gradients are spread into a row buffer once,
    // then every input row under it is written as D(buffer, a) in one
    // contiguous, vectorised loop. Cells no window covers (the floor
    // remainder) get D(0, a), as pool backward's zeros would.
    for (int64_t oh = 0; oh < oh_n; ++oh) {
      const float* dyr = dyp + oh * ow_n;
      if (s.kernel_w == 2) {
        for (int64_t ow = 0; ow < ow_n; ++ow) {
          const float g = dyr[ow] * inv_count;
          grad[2 * ow] = g;
          grad[2 * ow + 1] = g;
        }
      } else {
        for (int64_t ow = 0; ow < ow_n; ++ow) {
          const float g = dyr[ow] * inv_count;
          for (int64_t k = 0; k < s.kernel_w; ++k) grad[ow * s.kernel_w + k] = g;
        }
      }
      for (int64_t w = ow_n * s.kernel_w; w < s.width; ++w) grad[w] = 0.f;
      for (int64_t k = 0; k < s.kernel_h; ++k) {
        const int64_t offset = (oh * s.kernel_h + k) * s.width;
        for (int64_t w = 0; w < s.width; ++w) {
          dxp[offset + w] = Act::D(grad[w], ap[offset + w]);
        }
      }
    }
    for (int64_t i = oh_n * s.kernel_h * s.width; i < in_plane; ++i) {
      dxp[i] = Act::D(0.f, ap[i]);
    }
    return;
  }
  // General case: gather as pool_cpu.cc does, then the activation's step.
  for (int64_t h = 0; h < s.height; ++h) {
    int64_t oh0, oh1;
    OutputsCovering(h, s.kernel_h, s.stride_h, s.pad_h, oh_n, &oh0, &oh1);
    for (int64_t w = 0; w < s.width; ++w) {
      int64_t ow0, ow1;
      OutputsCovering(w, s.kernel_w, s.stride_w, s.pad_w, ow_n, &ow0, &ow1);
      float sum = 0.f;
      for (int64_t oh = oh0; oh < oh1; ++oh) {
        for (int64_t ow = ow0; ow < ow1; ++ow) sum += dyp[oh * ow_n + ow];
      }
      dxp[h * s.width + w] = Act::D(sum * inv_count, ap[h * s.width + w]);
    }
  }
}

template <class Act>
void MaxBackwardPlane(const Pool2dShape& s, const float* ap, const float* dyp, const int32_t* mp,
                      float* dxp) {
  const int64_t in_plane = s.height * s.width, out_plane = s.out_height() * s.out_width();
  std::fill(dxp, dxp + in_plane, 0.f);
  // Indices outside the plane are dropped, as in MaxPool2dBackwardCpu.
  for (int64_t o = 0; o < out_plane; ++o) {
    if (mp[o] >= 0 && mp[o] < in_plane) dxp[mp[o]] += dyp[o];
  }
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
