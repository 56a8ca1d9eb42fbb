#ifndef PS_KERNELS_POOL_PLANE_CPU_H_
#define PS_KERNELS_POOL_PLANE_CPU_H_

// Pooling of one (n, c) plane on the CPU: the loops behind pool_cpu.cc and
// the fused activation + pooling kernels (activation_pool_cpu.cc), written
// once so both compute bit-identical values. Inline, so that callers compiled
// with other target attributes (the fused kernels' AVX-512 clones) get their
// own copies.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/pool.h"

namespace ps::kernels::internal {

// Work is split by (n, c) planes, which are independent in every pass; a
// chunk gets at least this many elements so small layers stay on one thread.
inline int64_t MinPlanes(int64_t plane_elements) {
  constexpr int64_t kMinWorkPerChunk = 1 << 15;
  return std::max<int64_t>(1, kMinWorkPerChunk / std::max<int64_t>(1, plane_elements));
}

// The output range [*begin, *end) whose windows (start o * stride - pad,
// length kernel) contain input position i.
inline void OutputsCovering(int64_t i, int64_t kernel, int64_t stride, int64_t pad,
                            int64_t out_size, int64_t* begin, int64_t* end) {
  const int64_t p = i + pad;
  *begin = p < kernel ? 0 : (p - kernel) / stride + 1;
  *end = std::min(p / stride + 1, out_size);
}

// Windows that tile the plane without overlap or padding (LeNet's 2x2/2):
// the passes below then work on whole rows.
inline bool NonOverlapping(const Pool2dShape& s) {
  return s.stride_h == s.kernel_h && s.stride_w == s.kernel_w && s.pad_h == 0 && s.pad_w == 0;
}

// Max pooling of plane xp into yp, with each maximum's index (h * W + w) in
// mp. Padding never wins (it is -inf in PyTorch). The first maximum in
// row-major window order is kept; NaN wins and propagates, as in PyTorch.
// ValidatePool2dShape guarantees a non-empty window, since pad <= kernel / 2.
inline void MaxPoolPlane(const Pool2dShape& s, const float* xp, float* yp, int32_t* mp) {
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
          const float v = xp[h * s.width + w];
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

// dxp = the gradient of plane xp from dyp and the forward pass's indices mp,
// overwritten. Scatter within the plane, in output order (so overlapping
// windows sum in the same order as the CUDA gather). An index outside the
// plane (mp not from MaxPoolPlane with this shape) is dropped rather than
// written out of bounds; the CUDA gather ignores it the same way.
inline void MaxPoolBackwardPlane(const Pool2dShape& s, const float* dyp, const int32_t* mp,
                                 float* dxp) {
  const int64_t in_plane = s.height * s.width, out_plane = s.out_height() * s.out_width();
  std::fill(dxp, dxp + in_plane, 0.f);
  for (int64_t o = 0; o < out_plane; ++o) {
    if (mp[o] >= 0 && mp[o] < in_plane) dxp[mp[o]] += dyp[o];
  }
}

// Average pooling of plane xp into yp. count_include_pad: padded cells count
// as zeros; with floor output sizes every window lies inside the padded
// input, so the divisor is always kernel_h * kernel_w. `rows` is scratch of
// width floats.
inline void AvgPoolPlane(const Pool2dShape& s, const float* xp, float* yp, float* rows) {
  const int64_t oh_n = s.out_height(), ow_n = s.out_width();
  const float inv_count = 1.f / static_cast<float>(s.kernel_h * s.kernel_w);
  if (NonOverlapping(s)) {
    // A window's rows summed into a row buffer with contiguous, vectorisable
    // loops, then its column groups (unrolled for width-2 windows; the sum
    // starts at 0 as the generic loop's does, so the values are the same).
    for (int64_t oh = 0; oh < oh_n; ++oh) {
      const float* first = xp + oh * s.kernel_h * s.width;
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
        for (int64_t w = w0; w < w1; ++w) sum += xp[h * s.width + w];
      }
      yp[oh * ow_n + ow] = sum * inv_count;
    }
  }
}

// Writes dxp[i] = out(g, i) for every cell i of the plane, where g is the
// average-pooling gradient of cell i from dyp: (identity `out` for plain
// pooling; the fused kernels apply the activation's derivative). `grad` is
// scratch of width floats.
template <class Out>
inline void AvgPoolBackwardPlane(const Pool2dShape& s, const float* dyp, float* dxp, float* grad,
                                 const Out& out) {
  const int64_t oh_n = s.out_height(), ow_n = s.out_width();
  const int64_t in_plane = s.height * s.width;
  const float inv_count = 1.f / static_cast<float>(s.kernel_h * s.kernel_w);
  if (NonOverlapping(s)) {
    // Each window row's pooled gradients are spread into a row buffer once,
    // then every input row under it is written in one contiguous, vectorised
    // loop. Cells no window covers (the floor remainder) get out(0, i).
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
        for (int64_t w = 0; w < s.width; ++w) dxp[offset + w] = out(grad[w], offset + w);
      }
    }
    for (int64_t i = oh_n * s.kernel_h * s.width; i < in_plane; ++i) dxp[i] = out(0.f, i);
    return;
  }
  // General case: each input sums the outputs whose windows cover it, the
  // same order as the CUDA kernel.
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
      dxp[h * s.width + w] = out(sum * inv_count, h * s.width + w);
    }
  }
}

}  // namespace ps::kernels::internal

#endif  // PS_KERNELS_POOL_PLANE_CPU_H_
