#include "kernels/pool_cpu.h"

#include <vector>

#include "kernels/pool_plane_cpu.h"

namespace ps::kernels::internal {

// Every pass splits the batch by (n, c) planes, which are independent, and
// runs pool_plane_cpu.h's loops on each.

void MaxPool2dForwardCpu(CpuDevice& device, const Pool2dShape& s, const float* x, float* y,
                         int32_t* argmax) {
  const int64_t in_plane = s.height * s.width, out_plane = s.out_height() * s.out_width();
  device.ParallelFor(s.batch * s.channels, MinPlanes(in_plane), [&](int64_t b, int64_t e) {
    for (int64_t plane = b; plane < e; ++plane) {
      MaxPoolPlane(s, x + plane * in_plane, y + plane * out_plane, argmax + plane * out_plane);
    }
  });
}

void MaxPool2dBackwardCpu(CpuDevice& device, const Pool2dShape& s, const float* dy,
                          const int32_t* argmax, float* dx) {
  const int64_t in_plane = s.height * s.width, out_plane = s.out_height() * s.out_width();
  // argmax only points into its own plane, so planes never collide.
  device.ParallelFor(s.batch * s.channels, MinPlanes(in_plane), [&](int64_t b, int64_t e) {
    for (int64_t plane = b; plane < e; ++plane) {
      MaxPoolBackwardPlane(s, dy + plane * out_plane, argmax + plane * out_plane,
                           dx + plane * in_plane);
    }
  });
}

void AvgPool2dForwardCpu(CpuDevice& device, const Pool2dShape& s, const float* x, float* y) {
  const int64_t in_plane = s.height * s.width, out_plane = s.out_height() * s.out_width();
  device.ParallelFor(s.batch * s.channels, MinPlanes(in_plane), [&](int64_t b, int64_t e) {
    std::vector<float> rows(s.width);
    for (int64_t plane = b; plane < e; ++plane) {
      AvgPoolPlane(s, x + plane * in_plane, y + plane * out_plane, rows.data());
    }
  });
}

void AvgPool2dBackwardCpu(CpuDevice& device, const Pool2dShape& s, const float* dy, float* dx) {
  const int64_t in_plane = s.height * s.width, out_plane = s.out_height() * s.out_width();
  device.ParallelFor(s.batch * s.channels, MinPlanes(in_plane), [&](int64_t b, int64_t e) {
    std::vector<float> grad(s.width);
    for (int64_t plane = b; plane < e; ++plane) {
      AvgPoolBackwardPlane(s, dy + plane * out_plane, dx + plane * in_plane, grad.data(),
                           [](float g, int64_t) { return g; });
    }
  });
}

}  // namespace ps::kernels::internal
