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

// One plane's activation, in one long loop that vectorises well (sigmoid is
// compute-bound: ~25 vector operations per 8 values).
template <class Act>
void ActivatePlane(const float* x, int64_t n, float* a) {
  for (int64_t i = 0; i < n; ++i) a[i] = Act::F(x[i]);
}

template <class Act>
void AvgForward(CpuDevice& device, const Pool2dShape& s, const float* x, float* a, float* y) {
  const int64_t oh_n = s.out_height(), ow_n = s.out_width();
  const int64_t in_plane = s.height * s.width, out_plane = oh_n * ow_n;
  const float inv_count = 1.f / static_cast<float>(s.kernel_h * s.kernel_w);
  if (NonOverlapping(s)) {
    // Each plane is activated into `a` and pooled while it is in L1, with
    // pool_cpu.cc's fast path: a window's rows summed into a row buffer, then
    // its column groups (unrolled for LeNet's width-2 windows).
    device.ParallelFor(s.batch * s.channels, MinPlanes(in_plane), [&](int64_t b, int64_t e) {
      std::vector<float> rows_buffer(s.width);
      float* rows = rows_buffer.data();
      for (int64_t plane = b; plane < e; ++plane) {
        float* ap = a + plane * in_plane;
        ActivatePlane<Act>(x + plane * in_plane, in_plane, ap);
        float* yp = y + plane * out_plane;
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
      }
    });
    return;
  }
  device.ParallelFor(s.batch * s.channels, MinPlanes(in_plane), [&](int64_t b, int64_t e) {
    for (int64_t plane = b; plane < e; ++plane) {
      float* ap = a + plane * in_plane;
      ActivatePlane<Act>(x + plane * in_plane, in_plane, ap);
      float* yp = y + plane * out_plane;
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
  });
}

template <class Act>
void AvgBackward(CpuDevice& device, const Pool2dShape& s, const float* a, const float* dy,
                 float* dx) {
  const int64_t oh_n = s.out_height(), ow_n = s.out_width();
  const int64_t in_plane = s.height * s.width, out_plane = oh_n * ow_n;
  const float inv_count = 1.f / static_cast<float>(s.kernel_h * s.kernel_w);
  if (NonOverlapping(s)) {
    // Each window row's pooled gradients are spread into a row buffer once,
    // then every input row under it is written as D(buffer, a) in one
    // contiguous, vectorised loop. Cells no window covers (the floor
    // remainder) get D(0, a), as pool backward's zeros would.
    device.ParallelFor(s.batch * s.channels, MinPlanes(in_plane), [&](int64_t b, int64_t e) {
      std::vector<float> grad_buffer(s.width);
      float* grad = grad_buffer.data();
      for (int64_t plane = b; plane < e; ++plane) {
        const float* ap = a + plane * in_plane;
        float* dxp = dx + plane * in_plane;
        const float* dyp = dy + plane * out_plane;
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
      }
    });
    return;
  }
  // General case: gather as pool_cpu.cc does, then the activation's step.
  std::vector<int64_t> oh_begin(s.height), oh_end(s.height), ow_begin(s.width), ow_end(s.width);
  for (int64_t h = 0; h < s.height; ++h) {
    OutputsCovering(h, s.kernel_h, s.stride_h, s.pad_h, oh_n, &oh_begin[h], &oh_end[h]);
  }
  for (int64_t w = 0; w < s.width; ++w) {
    OutputsCovering(w, s.kernel_w, s.stride_w, s.pad_w, ow_n, &ow_begin[w], &ow_end[w]);
  }
  device.ParallelFor(s.batch * s.channels, MinPlanes(in_plane), [&](int64_t b, int64_t e) {
    for (int64_t plane = b; plane < e; ++plane) {
      const float* ap = a + plane * in_plane;
      float* dxp = dx + plane * in_plane;
      const float* dyp = dy + plane * out_plane;
      for (int64_t h = 0; h < s.height; ++h) {
        for (int64_t w = 0; w < s.width; ++w) {
          float sum = 0.f;
          for (int64_t oh = oh_begin[h]; oh < oh_end[h]; ++oh) {
            for (int64_t ow = ow_begin[w]; ow < ow_end[w]; ++ow) sum += dyp[oh * ow_n + ow];
          }
          dxp[h * s.width + w] = Act::D(sum * inv_count, ap[h * s.width + w]);
        }
      }
    }
  });
}

template <class Act>
void MaxForward(CpuDevice& device, const Pool2dShape& s, const float* x, float* a, float* y,
                int32_t* argmax) {
  const int64_t oh_n = s.out_height(), ow_n = s.out_width();
  const int64_t in_plane = s.height * s.width, out_plane = oh_n * ow_n;
  device.ParallelFor(s.batch * s.channels, MinPlanes(in_plane), [&](int64_t b, int64_t e) {
    for (int64_t plane = b; plane < e; ++plane) {
      float* ap = a + plane * in_plane;
      ActivatePlane<Act>(x + plane * in_plane, in_plane, ap);
      float* yp = y + plane * out_plane;
      int32_t* mp = argmax + plane * out_plane;
      for (int64_t oh = 0; oh < oh_n; ++oh) {
        const int64_t h0 = std::max<int64_t>(oh * s.stride_h - s.pad_h, 0);
        const int64_t h1 = std::min(oh * s.stride_h - s.pad_h + s.kernel_h, s.height);
        for (int64_t ow = 0; ow < ow_n; ++ow) {
          const int64_t w0 = std::max<int64_t>(ow * s.stride_w - s.pad_w, 0);
          const int64_t w1 = std::min(ow * s.stride_w - s.pad_w + s.kernel_w, s.width);
          // As MaxPool2dForwardCpu: first maximum wins, NaN propagates.
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
  });
}

template <class Act>
void MaxBackward(CpuDevice& device, const Pool2dShape& s, const float* a, const float* dy,
                 const int32_t* argmax, float* dx) {
  const int64_t in_plane = s.height * s.width, out_plane = s.out_height() * s.out_width();
  device.ParallelFor(s.batch * s.channels, MinPlanes(in_plane), [&](int64_t b, int64_t e) {
    for (int64_t plane = b; plane < e; ++plane) {
      const float* ap = a + plane * in_plane;
      float* dxp = dx + plane * in_plane;
      const float* dyp = dy + plane * out_plane;
      const int32_t* mp = argmax + plane * out_plane;
      std::fill(dxp, dxp + in_plane, 0.f);
      // Indices outside the plane are dropped, as in MaxPool2dBackwardCpu.
      for (int64_t o = 0; o < out_plane; ++o) {
        if (mp[o] >= 0 && mp[o] < in_plane) dxp[mp[o]] += dyp[o];
      }
      for (int64_t i = 0; i < in_plane; ++i) dxp[i] = Act::D(dxp[i], ap[i]);
    }
  });
}

}  // namespace

void ActivationAvgPool2dForwardCpu(CpuDevice& device, PoolActivation act, const Pool2dShape& shape,
                                   const float* x, float* a, float* y) {
  if (act == PoolActivation::kSigmoid) {
    AvgForward<SigmoidOp>(device, shape, x, a, y);
  } else {
    AvgForward<ReluOp>(device, shape, x, a, y);
  }
}

void ActivationAvgPool2dBackwardCpu(CpuDevice& device, PoolActivation act,
                                    const Pool2dShape& shape, const float* a, const float* dy,
                                    float* dx) {
  if (act == PoolActivation::kSigmoid) {
    AvgBackward<SigmoidOp>(device, shape, a, dy, dx);
  } else {
    AvgBackward<ReluOp>(device, shape, a, dy, dx);
  }
}

void ActivationMaxPool2dForwardCpu(CpuDevice& device, PoolActivation act, const Pool2dShape& shape,
                                   const float* x, float* a, float* y, int32_t* argmax) {
  if (act == PoolActivation::kSigmoid) {
    MaxForward<SigmoidOp>(device, shape, x, a, y, argmax);
  } else {
    MaxForward<ReluOp>(device, shape, x, a, y, argmax);
  }
}

void ActivationMaxPool2dBackwardCpu(CpuDevice& device, PoolActivation act,
                                    const Pool2dShape& shape, const float* a, const float* dy,
                                    const int32_t* argmax, float* dx) {
  if (act == PoolActivation::kSigmoid) {
    MaxBackward<SigmoidOp>(device, shape, a, dy, argmax, dx);
  } else {
    MaxBackward<ReluOp>(device, shape, a, dy, argmax, dx);
  }
}

}  // namespace ps::kernels::internal
