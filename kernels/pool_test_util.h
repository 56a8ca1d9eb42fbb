#ifndef PS_KERNELS_POOL_TEST_UTIL_H_
#define PS_KERNELS_POOL_TEST_UTIL_H_

// Shapes for the pooling tests (plain and fused with an activation).

#include <cstdint>

#include "kernels/pool.h"

namespace ps::kernels::testing {

// A square-window Pool2dShape: batch n, channels c, input h x w, kernel k,
// stride s, padding p.
inline Pool2dShape MakePoolShape(int64_t n, int64_t c, int64_t h, int64_t w, int64_t k,
                                 int64_t s, int64_t p) {
  Pool2dShape shape;
  shape.batch = n;
  shape.channels = c;
  shape.height = h;
  shape.width = w;
  shape.kernel_h = shape.kernel_w = k;
  shape.stride_h = shape.stride_w = s;
  shape.pad_h = shape.pad_w = p;
  return shape;
}

// A rectangular 4x3 window with strides 3x2 and padding 2x1 over a 10x9
// input: every per-axis field differs, so a swapped axis shows.
inline Pool2dShape RectangularPoolShape() {
  Pool2dShape rect = MakePoolShape(2, 2, 10, 9, 1, 1, 0);
  rect.kernel_h = 4;
  rect.kernel_w = 3;
  rect.stride_h = 3;
  rect.stride_w = 2;
  rect.pad_h = 2;
  rect.pad_w = 1;
  return rect;
}

// Elements of the input and of the output.
inline int64_t InSize(const Pool2dShape& s) { return s.batch * s.channels * s.height * s.width; }
inline int64_t OutSize(const Pool2dShape& s) {
  return s.batch * s.channels * s.out_height() * s.out_width();
}

}  // namespace ps::kernels::testing

#endif  // PS_KERNELS_POOL_TEST_UTIL_H_
