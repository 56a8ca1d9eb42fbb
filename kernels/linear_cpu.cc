#include "kernels/linear_cpu.h"

#include <algorithm>
#include <cstring>

#include "kernels/gemm.h"

namespace ps::kernels::internal {
namespace {

// Below this many elements a bias pass stays on one thread: waking the pool
// costs more than the work.
constexpr int64_t kMinChunkElements = 1 << 15;
// Rows of a GEMM slice (see Slices) at the least, so each slice is still a
// GEMM worth a BLAS call.
constexpr int64_t kMinSliceRows = 32;

// Runs fn(begin, end) over slices of [0, rows) that each call a GEMM on
// their rows. With single-threaded GEMMs the device's threads take one
// slice each; with multi-threaded GEMMs a single slice runs on the calling
// thread and oneDNN threads it, so the two thread pools never compete.
template <typename Fn>
void Slices(CpuDevice& device, int64_t rows, const Fn& fn) {
  if (rows <= 0) return;
  if (BlasThreads() > 1) {
    fn(int64_t{0}, rows);
    return;
  }
  device.ParallelFor(rows, kMinSliceRows, fn);
}

}  // namespace

void LinearForwardCpu(CpuDevice& device, int64_t batch, int64_t in_features, int64_t out_features,
                      const float* x, const float* weight, const float* bias, float* y) {
  if (batch == 0 || out_features == 0) return;
  const Precision precision = device.gemm_precision();
  const int64_t ld_in = std::max<int64_t>(1, in_features);
  Slices(device, batch, [=](int64_t begin, int64_t end) {
    // Start y at the bias and let the GEMM add x * weight^T (beta = 1): one
    // pass over y instead of a GEMM write followed by a read-modify-write.
    if (bias != nullptr) {
      for (int64_t r = begin; r < end; ++r) {
        std::memcpy(y + r * out_features, bias, out_features * sizeof(float));
      }
    }
    GemmCpu(precision, false, true, end - begin, out_features, in_features, 1.f,
            x + begin * in_features, ld_in, weight, ld_in, bias != nullptr ? 1.f : 0.f,
            y + begin * out_features, out_features);
  });
}

void LinearBackwardCpu(CpuDevice& device, int64_t batch, int64_t in_features, int64_t out_features,
                       const float* x, const float* weight, const float* dy, float* dx,
                       float* dweight, float* dbias) {
  const int64_t ld_in = std::max<int64_t>(1, in_features);
  const int64_t ld_out = std::max<int64_t>(1, out_features);
  const Precision precision = device.gemm_precision();
  // dx [N x in] = dy [N x out] * weight [out x in], sliced by samples.
  if (dx != nullptr) {
    Slices(device, batch, [=](int64_t begin, int64_t end) {
      GemmCpu(precision, false, false, end - begin, in_features, out_features, 1.f,
              dy + begin * out_features, ld_out, weight, ld_in, 0.f, dx + begin * in_features,
              ld_in);
    });
  }
  // dweight [out x in] = dy^T * x, sliced by output features: slice [b, e)
  // is columns [b, e) of dy. With an empty batch BLAS scales C by beta = 0,
  // so dweight becomes zero.
  if (dweight != nullptr) {
    Slices(device, out_features, [=](int64_t begin, int64_t end) {
      GemmCpu(precision, true, false, end - begin, in_features, batch, 1.f, dy + begin, ld_out, x,
              ld_in, 0.f, dweight + begin * in_features, ld_in);
    });
  }
  // dbias = column sums of dy, split by columns so each thread owns its
  // outputs; the rows are added in order, so results do not depend on the
  // thread count.
  if (dbias != nullptr && out_features > 0) {
    const int64_t min_cols = std::max<int64_t>(1, kMinChunkElements / std::max<int64_t>(1, batch));
    device.ParallelFor(out_features, min_cols, [=](int64_t begin, int64_t end) {
      std::fill(dbias + begin, dbias + end, 0.f);
      for (int64_t r = 0; r < batch; ++r) {
        const float* row = dy + r * out_features;
        for (int64_t c = begin; c < end; ++c) dbias[c] += row[c];
      }
    });
  }
}

void LinearForwardRowsCpu(CpuDevice& device, int64_t batch, int64_t in_features,
                          int64_t out_features, const float* x, const float* weight,
                          int64_t row_begin, int64_t row_end, float* y) {
  if (batch == 0 || row_end <= row_begin) return;
  const Precision precision = device.gemm_precision();
  const int64_t ld_in = std::max<int64_t>(1, in_features);
  Slices(device, batch, [=](int64_t begin, int64_t end) {
    GemmCpu(precision, false, true, end - begin, row_end - row_begin, in_features, 1.f,
            x + begin * in_features, ld_in, weight + row_begin * in_features, ld_in, 0.f,
            y + begin * out_features + row_begin, std::max<int64_t>(1, out_features));
  });
}

void LinearAddBiasCpu(CpuDevice& device, int64_t batch, int64_t out_features, const float* bias,
                      float* y) {
  if (batch == 0 || out_features == 0) return;
  const int64_t min_rows = std::max<int64_t>(1, kMinChunkElements / out_features);
  device.ParallelFor(batch, min_rows, [=](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* row = y + r * out_features;
      for (int64_t c = 0; c < out_features; ++c) row[c] += bias[c];
    }
  });
}

void LinearWeightGradientRowsCpu(CpuDevice& device, int64_t batch, int64_t in_features,
                                 int64_t out_features, const float* x, const float* dy,
                                 int64_t row_begin, int64_t row_end, float* dweight) {
  if (row_end <= row_begin) return;
  const int64_t ld_in = std::max<int64_t>(1, in_features);
  const int64_t ld_out = std::max<int64_t>(1, out_features);
  const Precision precision = device.gemm_precision();
  Slices(device, row_end - row_begin, [=](int64_t begin, int64_t end) {
    GemmCpu(precision, true, false, end - begin, in_features, batch, 1.f,
            dy + row_begin + begin, ld_out, x, ld_in, 0.f,
            dweight + (row_begin + begin) * in_features, ld_in);
  });
}

}  // namespace ps::kernels::internal
