#include "kernels/pool_cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace ps::kernels::internal {
namespace {

// Work is split by (n, c) planes, which are independent in every pass; a
// chunk gets at least this many elements so small layers stay on one thread.
constexpr int64_t kMinWorkPerChunk = 1 << 15;

int64_t MinPlanes(int64_t plane_elements) {
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

}  // namespace

void MaxPool2dForwardCpu(CpuDevice& device, const Pool2dShape& s, const float* x, float* y,
                         int32_t* argmax) {
  const int64_t oh_n = s.out_height(), ow_n = s.out_width();
  const int64_t in_plane = s.height * s.width, out_plane = oh_n * ow_n;
  device.ParallelFor(s.batch * s.channels, MinPlanes(in_plane), [&](int64_t b, int64_t e) {
    for (int64_t plane = b; plane < e; ++plane) {
      const float* xp = x + plane * in_plane;
      float* yp = y + plane * out_plane;
      int32_t* ap = argmax + plane * out_plane;
      for (int64_t oh = 0; oh < oh_n; ++oh) {
        const int64_t h0 = std::max<int64_t>(oh * s.stride_h - s.pad_h, 0);
        const int64_t h1 = std::min(oh * s.stride_h - s.pad_h + s.kernel_h, s.height);
        for (int64_t ow = 0; ow < ow_n; ++ow) {
          const int64_t w0 = std::max<int64_t>(ow * s.stride_w - s.pad_w, 0);
          const int64_t w1 = std::min(ow * s.stride_w - s.pad_w + s.kernel_w, s.width);
          // Padding never wins (it is -inf in PyTorch). The first maximum in
          // row-major window order is kept; NaN wins and propagates, as in
          // PyTorch. ValidatePool2dShape guarantees a non-empty window, since
          // pad <= kernel / 2.
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
          ap[oh * ow_n + ow] = static_cast<int32_t>(best);
        }
      }
    }
  });
}

void MaxPool2dBackwardCpu(CpuDevice& device, const Pool2dShape& s, const float* dy,
                          const int32_t* argmax, float* dx) {
  const int64_t in_plane = s.height * s.width, out_plane = s.out_height() * s.out_width();
  // Scatter within each plane: argmax only points into its own plane, so
  // planes never collide and a plane's sums run in output order.
  device.ParallelFor(s.batch * s.channels, MinPlanes(in_plane), [&](int64_t b, int64_t e) {
    for (int64_t plane = b; plane < e; ++plane) {
      float* dxp = dx + plane * in_plane;
      const float* dyp = dy + plane * out_plane;
      const int32_t* ap = argmax + plane * out_plane;
      std::fill(dxp, dxp + in_plane, 0.f);
      // An index outside the plane (argmax not from MaxPool2dForward with this
      // shape) is dropped rather than written out of bounds; the CUDA gather
      // ignores it the same way.
      for (int64_t o = 0; o < out_plane; ++o) {
        if (ap[o] >= 0 && ap[o] < in_plane) dxp[ap[o]] += dyp[o];
      }
    }
  });
}

void AvgPool2dForwardCpu(CpuDevice& device, const Pool2dShape& s, const float* x, float* y) {
  const int64_t oh_n = s.out_height(), ow_n = s.out_width();
  const int64_t in_plane = s.height * s.width, out_plane = oh_n * ow_n;
  // count_include_pad: padded cells count as zeros. With floor output sizes
  // every window lies inside the padded input, so the divisor is always
  // kernel_h * kernel_w.
  const float inv_count = 1.f / static_cast<float>(s.kernel_h * s.kernel_w);
  if (s.stride_h == s.kernel_h && s.stride_w == s.kernel_w && s.pad_h == 0 && s.pad_w == 0) {
    // Non-overlapping windows (LeNet's 2x2/2): add each window's rows into a
    // row buffer with contiguous, vectorisable loops, then sum column groups.
    device.ParallelFor(s.batch * s.channels, MinPlanes(in_plane), [&](int64_t b, int64_t e) {
      std::vector<float> rows(s.width);
      for (int64_t plane = b; plane < e; ++plane) {
        const float* xp = x + plane * in_plane;
        float* yp = y + plane * out_plane;
        for (int64_t oh = 0; oh < oh_n; ++oh) {
          const float* first = xp + oh * s.kernel_h * s.width;
          std::copy(first, first + s.width, rows.begin());
          for (int64_t k = 1; k < s.kernel_h; ++k) {
            const float* row = first + k * s.width;
            for (int64_t w = 0; w < s.width; ++w) rows[w] += row[w];
          }
          for (int64_t ow = 0; ow < ow_n; ++ow) {
            float sum = 0.f;
            for (int64_t k = 0; k < s.kernel_w; ++k) sum += rows[ow * s.kernel_w + k];
            yp[oh * ow_n + ow] = sum * inv_count;
          }
        }
      }
    });
    return;
  }
  device.ParallelFor(s.batch * s.channels, MinPlanes(in_plane), [&](int64_t b, int64_t e) {
    for (int64_t plane = b; plane < e; ++plane) {
      const float* xp = x + plane * in_plane;
      float* yp = y + plane * out_plane;
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
  });
}

void AvgPool2dBackwardCpu(CpuDevice& device, const Pool2dShape& s, const float* dy, float* dx) {
  const int64_t oh_n = s.out_height(), ow_n = s.out_width();
  const int64_t in_plane = s.height * s.width, out_plane = oh_n * ow_n;
  const float inv_count = 1.f / static_cast<float>(s.kernel_h * s.kernel_w);
  if (s.stride_h == s.kernel_h && s.stride_w == s.kernel_w && s.pad_h == 0 && s.pad_w == 0) {
    // Non-overlapping windows (LeNet's 2x2/2): each input cell gets its one
    // window's gradient, so spread each output over its window row by row.
    // Cells no window covers (the floor remainder) get zero.
    device.ParallelFor(s.batch * s.channels, MinPlanes(in_plane), [&](int64_t b, int64_t e) {
      for (int64_t plane = b; plane < e; ++plane) {
        float* dxp = dx + plane * in_plane;
        const float* dyp = dy + plane * out_plane;
        for (int64_t oh = 0; oh < oh_n; ++oh) {
          float* row = dxp + oh * s.kernel_h * s.width;
          const float* dyr = dyp + oh * ow_n;
          for (int64_t ow = 0; ow < ow_n; ++ow) {
            const float g = dyr[ow] * inv_count;
            for (int64_t k = 0; k < s.kernel_w; ++k) row[ow * s.kernel_w + k] = g;
          }
          for (int64_t w = ow_n * s.kernel_w; w < s.width; ++w) row[w] = 0.f;
          for (int64_t k = 1; k < s.kernel_h; ++k) {
            std::copy(row, row + s.width, row + k * s.width);
          }
        }
        std::fill(dxp + oh_n * s.kernel_h * s.width, dxp + in_plane, 0.f);
      }
    });
    return;
  }
  // General case. The output ranges covering each row and column are the
  // same for every plane: compute them once, not with divisions per cell.
  std::vector<int64_t> oh_begin(s.height), oh_end(s.height), ow_begin(s.width), ow_end(s.width);
  for (int64_t h = 0; h < s.height; ++h) {
    OutputsCovering(h, s.kernel_h, s.stride_h, s.pad_h, oh_n, &oh_begin[h], &oh_end[h]);
  }
  for (int64_t w = 0; w < s.width; ++w) {
    OutputsCovering(w, s.kernel_w, s.stride_w, s.pad_w, ow_n, &ow_begin[w], &ow_end[w]);
  }
  // Gather: each input sums the outputs whose windows cover it, the same
  // order as the CUDA kernel.
  device.ParallelFor(s.batch * s.channels, MinPlanes(in_plane), [&](int64_t b, int64_t e) {
    for (int64_t plane = b; plane < e; ++plane) {
      float* dxp = dx + plane * in_plane;
      const float* dyp = dy + plane * out_plane;
      for (int64_t h = 0; h < s.height; ++h) {
        for (int64_t w = 0; w < s.width; ++w) {
          float sum = 0.f;
          for (int64_t oh = oh_begin[h]; oh < oh_end[h]; ++oh) {
            for (int64_t ow = ow_begin[w]; ow < ow_end[w]; ++ow) sum += dyp[oh * ow_n + ow];
          }
          dxp[h * s.width + w] = sum * inv_count;
        }
      }
    }
  });
}

}  // namespace ps::kernels::internal
