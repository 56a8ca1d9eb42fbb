#include "kernels/conv_cpu.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <vector>

#include "common/status_macros.h"
#include "kernels/activation_pool_cpu.h"
#include "kernels/gemm.h"

namespace ps::kernels::internal {
namespace {

// One block's im2col columns aim at this many bytes (at least one sample).
// Small blocks win: the columns are written, packed and read while they are
// still in L1/L2. Measured for LeNet's layers at batch 256 on one core (with
// OpenBLAS's GEMMs, which slowed down 3x beyond about 7000 columns):
// 128-256 KiB within noise of each other, 512 KiB 10-50% and 768 KiB up to
// 2.5x slower.
constexpr int64_t kBlockColumnBytes = 192 << 10;

// Eight floats, for the copy loops below: GCC at -O2 does not vectorise loops
// whose trip count is unknown, and these loops run over short image rows.
typedef float Vec8 __attribute__((vector_size(32)));

inline Vec8 Load8(const float* p) {
  Vec8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void Store8(float* p, Vec8 v) { std::memcpy(p, &v, sizeof(v)); }

// dst[i] = src[i] + b, for src and dst that do not overlap. As in CopyRow
// below, the last vector may overlap the one before it instead of a tail.
inline void CopyAdd(const float* src, float b, float* dst, int64_t n) {
  if (n < 8) {
    for (int64_t i = 0; i < n; ++i) dst[i] = src[i] + b;
    return;
  }
  for (int64_t i = 0; i + 8 < n; i += 8) Store8(dst + i, Load8(src + i) + b);
  Store8(dst + n - 8, Load8(src + n - 8) + b);
}

inline void Copy(const float* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) Store8(dst + i, Load8(src + i));
  for (; i < n; ++i) dst[i] = src[i];
}

// dst[i] += b.
inline void AddScalar(float b, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) Store8(dst + i, Load8(dst + i) + b);
  for (; i < n; ++i) dst[i] += b;
}

// dst[i] += src[i].
// The tail goes four, then two floats at a time (col2im's rows are short:
// 10 floats for LeNet's conv2, whose scalar tail cost as much as its vector).
typedef float Vec4 __attribute__((vector_size(16)));
typedef float Vec2 __attribute__((vector_size(8)));

inline void Accumulate(const float* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) Store8(dst + i, Load8(dst + i) + Load8(src + i));
  if (i + 4 <= n) {
    Vec4 a, b;
    std::memcpy(&a, dst + i, sizeof(a));
    std::memcpy(&b, src + i, sizeof(b));
    a += b;
    std::memcpy(dst + i, &a, sizeof(a));
    i += 4;
  }
  if (i + 2 <= n) {
    Vec2 a, b;
    std::memcpy(&a, dst + i, sizeof(a));
    std::memcpy(&b, src + i, sizeof(b));
    a += b;
    std::memcpy(dst + i, &a, sizeof(a));
    i += 2;
  }
  if (i < n) dst[i] += src[i];
}

// Sum of src[0, n), in eight lanes (which also keeps the rounding error of
// long sums small).
inline float Sum(const float* src, int64_t n) {
  Vec8 acc = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) acc += Load8(src + i);
  float sum = 0;
  for (; i < n; ++i) sum += src[i];
  for (int l = 0; l < 8; ++l) sum += acc[l];
  return sum;
}

// Sum of src[0, n) while copying it to dst.
inline float CopySum(const float* src, float* dst, int64_t n) {
  Vec8 acc = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const Vec8 v = Load8(src + i);
    Store8(dst + i, v);
    acc += v;
  }
  float sum = 0;
  for (; i < n; ++i) sum += dst[i] = src[i];
  for (int l = 0; l < 8; ++l) sum += acc[l];
  return sum;
}

// Sizes derived from a validated shape, in elements.
struct Geometry {
  Geometry(const Conv2dShape& s, Precision gemm_precision)
      : precision(gemm_precision),
        batch(s.batch),
        c(s.in_channels),
        h(s.height),
        w(s.width),
        o(s.out_channels),
        kh(s.kernel_h),
        kw(s.kernel_w),
        sh(s.stride_h),
        sw(s.stride_w),
        ph(s.pad_h),
        pw(s.pad_w),
        oh(s.out_height()),
        ow(s.out_width()),
        p(oh * ow),
        k(c * kh * kw),
        in_size(c * h * w),
        out_size(o * p),
        pointwise(kh == 1 && kw == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0) {}

  const Precision precision;  // of the device's GEMMs
  const int64_t batch, c, h, w, o, kh, kw, sh, sw, ph, pw, oh, ow;
  const int64_t p;         // output pixels per channel
  const int64_t k;         // GEMM depth: input channels x kernel taps
  const int64_t in_size;   // input elements per sample
  const int64_t out_size;  // output elements per sample
  // A 1x1 kernel with unit stride and no padding: one sample's columns are
  // its input as stored.
  const bool pointwise;
};

// dst row r = src row r for `rows` rows of n floats; the source rows are
// `src_stride` apart, the destination rows packed. For n >= 8 there is no
// scalar tail: a row's last vector overlaps the one before it and rewrites
// the same values. Image rows are short (10 to 32 floats for LeNet), so a
// tail would cost as much as the body. (Everything here is a parameter or a
// local: the memcpy stores could alias any memory, so values read through
// pointers would be reloaded after every store.)
void CopyRows(const float* src, int64_t src_stride, float* dst, int64_t n, int64_t rows) {
  if (n < 8) {
    for (int64_t r = 0; r < rows; ++r, src += src_stride, dst += n) {
      for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
    }
    return;
  }
  for (int64_t r = 0; r < rows; ++r, src += src_stride, dst += n) {
    for (int64_t i = 0; i + 8 < n; i += 8) Store8(dst + i, Load8(src + i));
    Store8(dst + n - 8, Load8(src + n - 8));
  }
}

// CopyRows with AVX-512 lane masks: a row of n <= 32 floats is one or two
// masked 16-float copies, against up to four 8-float copies (the last one
// overlapping) with AVX2. Only called where the CPU has AVX-512.
__attribute__((target("avx512f"))) void CopyRowsAvx512(const float* src, int64_t src_stride,
                                                       float* dst, int64_t n, int64_t rows) {
  if (n > 32) {
    CopyRows(src, src_stride, dst, n, rows);
    return;
  }
  const __mmask16 first = n >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << n) - 1);
  const __mmask16 second = n <= 16 ? __mmask16{0} : static_cast<__mmask16>((1u << (n - 16)) - 1);
  if (second == 0) {
    for (int64_t r = 0; r < rows; ++r, src += src_stride, dst += n) {
      _mm512_mask_storeu_ps(dst, first, _mm512_maskz_loadu_ps(first, src));
    }
    return;
  }
  for (int64_t r = 0; r < rows; ++r, src += src_stride, dst += n) {
    _mm512_storeu_ps(dst, _mm512_loadu_ps(src));
    _mm512_mask_storeu_ps(dst + 16, second, _mm512_maskz_loadu_ps(second, src + 16));
  }
}

// As CopyRows, reading every `step`-th source element.
void CopyRowsStrided(const float* src, int64_t src_stride, int64_t step, float* dst, int64_t n,
                     int64_t rows) {
  for (int64_t r = 0; r < rows; ++r, src += src_stride, dst += n) {
    for (int64_t i = 0; i < n; ++i) dst[i] = src[i * step];
  }
}

// The input plane as the kernel sees it: `plane` itself when there is no
// padding, else `padded` ((h + 2 ph) x (w + 2 pw) floats) filled with the
// plane inside a zero border. Returns the plane to read and its row length.
const float* PaddedPlane(const Geometry& g, const float* plane, float* padded, int64_t* row) {
  if (g.ph == 0 && g.pw == 0) {
    *row = g.w;
    return plane;
  }
  const int64_t wp = g.w + 2 * g.pw;
  std::memset(padded, 0, g.ph * wp * sizeof(float));
  float* dst = padded + g.ph * wp;
  for (int64_t r = 0; r < g.h; ++r, dst += wp) {
    for (int64_t q = 0; q < g.pw; ++q) dst[q] = 0;
    Copy(plane + r * g.w, dst + g.pw, g.w);
    for (int64_t q = g.pw + g.w; q < wp; ++q) dst[q] = 0;
  }
  std::memset(dst, 0, g.ph * wp * sizeof(float));
  *row = wp;
  return padded;
}

// Columns of `count` samples starting at x: row (ci, i, j) of `cols`, of
// length count * p, holds for each sample and output pixel the input value
// under kernel tap (i, j) of channel ci, or 0 in the padding. `padded` holds
// PaddedFloats(g) floats.
void Im2Col(const Geometry& g, const float* x, int64_t count, float* cols, float* padded) {
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  const int64_t ld = count * g.p;
  for (int64_t s = 0; s < count; ++s) {
    for (int64_t ci = 0; ci < g.c; ++ci) {
      int64_t wp;
      const float* plane = PaddedPlane(g, x + (s * g.c + ci) * g.h * g.w, padded, &wp);
      for (int64_t i = 0; i < g.kh; ++i) {
        for (int64_t j = 0; j < g.kw; ++j) {
          float* dst = cols + ((ci * g.kh + i) * g.kw + j) * ld + s * g.p;
          const float* src = plane + i * wp + j;
          if (g.sw == 1 && avx512) {
            CopyRowsAvx512(src, g.sh * wp, dst, g.ow, g.oh);
          } else if (g.sw == 1) {
            CopyRows(src, g.sh * wp, dst, g.ow, g.oh);
          } else {
            CopyRowsStrided(src, g.sh * wp, g.sw, dst, g.ow, g.oh);
          }
        }
      }
    }
  }
}

// dst row r += src row r, for `rows` rows of n floats; the destination rows
// are `dst_stride` apart (every `step`-th element), the source rows packed.
void AccumulateRows(const float* src, float* dst, int64_t dst_stride, int64_t step, int64_t n,
                    int64_t rows) {
  for (int64_t r = 0; r < rows; ++r, src += n, dst += dst_stride) {
    if (step == 1) {
      Accumulate(src, dst, n);
    } else {
      for (int64_t i = 0; i < n; ++i) dst[i * step] += src[i];
    }
  }
}

// The adjoint of Im2Col: overwrites the `count` samples of dx with the sums
// of their columns' entries. With padding the sums go to the zero-bordered
// plane `padded` first, whose interior is then copied out, so no row needs
// clipping.
void Col2Im(const Geometry& g, const float* cols, int64_t count, float* dx, float* padded) {
  const int64_t ld = count * g.p;
  const bool pad = g.ph != 0 || g.pw != 0;
  const int64_t row = pad ? g.w + 2 * g.pw : g.w;
  const int64_t plane_floats = pad ? (g.h + 2 * g.ph) * row : g.h * g.w;
  for (int64_t s = 0; s < count; ++s) {
    for (int64_t ci = 0; ci < g.c; ++ci) {
      float* out = dx + (s * g.c + ci) * g.h * g.w;
      float* acc = pad ? padded : out;
      std::memset(acc, 0, plane_floats * sizeof(float));
      // Kernel column outermost: every row then adds into the plane at the
      // same offset j, so a load of a row that was just stored matches that
      // store exactly and is forwarded from it (an overlapping store at
      // another offset, as with j innermost, stalls the load instead).
      for (int64_t j = 0; j < g.kw; ++j) {
        for (int64_t i = 0; i < g.kh; ++i) {
          const float* src = cols + ((ci * g.kh + i) * g.kw + j) * ld + s * g.p;
          AccumulateRows(src, acc + i * row + j, g.sh * row, g.sw, g.ow, g.oh);
        }
      }
      if (pad) {
        for (int64_t r = 0; r < g.h; ++r) Copy(acc + (r + g.ph) * row + g.pw, out + r * g.w, g.w);
      }
    }
  }
}

// How the batch is cut into blocks and the blocks shared among threads.
struct Plan {
  int64_t block = 1;  // samples per block (the last may hold fewer)
  int64_t num_blocks = 1;
  int workers = 1;            // threads running blocks, each with its own scratch
  int64_t cols_floats = 0;    // one worker's columns: k x (block * p)
  int64_t padded_floats = 0;  // one worker's zero-bordered input plane
  int64_t out_floats = 0;     // one worker's GEMM output or dy block: o x (block * p)

  // Worker t's blocks are [BlockBegin(t), BlockBegin(t + 1)).
  int64_t BlockBegin(int t) const { return num_blocks * t / workers; }
};

Plan MakePlan(const Geometry& g, const CpuDevice& device) {
  Plan plan;
  const int64_t sample_bytes = g.k * g.p * static_cast<int64_t>(sizeof(float));
  plan.block = std::clamp<int64_t>(kBlockColumnBytes / sample_bytes, 1, g.batch);
  // With several threads each runs whole blocks (im2col, GEMM, write-back),
  // its GEMMs then single-threaded (see gemm.h): the copies are spread too.
  const bool run_blocks_on_threads = device.num_threads() > 1;
  plan.num_blocks = (g.batch + plan.block - 1) / plan.block;
  if (run_blocks_on_threads && plan.num_blocks > 1) {
    plan.workers = static_cast<int>(std::min<int64_t>(device.num_threads(), plan.num_blocks));
    // Equal shares: a multiple of `workers` blocks.
    plan.num_blocks = (plan.num_blocks + plan.workers - 1) / plan.workers * plan.workers;
    plan.num_blocks = std::min(plan.num_blocks, g.batch);
  }
  // Even block sizes, so no block is left with a sliver of the batch.
  plan.block = (g.batch + plan.num_blocks - 1) / plan.num_blocks;
  plan.num_blocks = (g.batch + plan.block - 1) / plan.block;
  plan.workers = static_cast<int>(std::min<int64_t>(plan.workers, plan.num_blocks));
  plan.cols_floats = g.k * plan.block * g.p;
  plan.padded_floats = g.ph == 0 && g.pw == 0 ? 0 : (g.h + 2 * g.ph) * (g.w + 2 * g.pw);
  plan.out_floats = g.o * plan.block * g.p;
  return plan;
}

// Calls fn(t) for t in [0, workers): on the calling thread when workers is 1,
// else one call per device thread.
void RunWorkers(CpuDevice& device, int workers, const std::function<void(int)>& fn) {
  if (workers == 1) {
    fn(0);
    return;
  }
  device.ParallelFor(workers, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) fn(static_cast<int>(t));
  });
}

absl::StatusOr<float*> ScratchFloats(CpuDevice& device, int slot, int64_t floats) {
  PS_ASSIGN_OR_RETURN(void* ptr,
                      device.Scratch(slot, floats * static_cast<int64_t>(sizeof(float))));
  return static_cast<float*>(ptr);
}

// One worker's share of the scratch slots.
struct WorkerBuffers {
  float* cols;    // plan.cols_floats: the block's columns (or their gradient)
  float* padded;  // plan.padded_floats: one zero-bordered input plane
  float* block;   // plan.out_floats: the block's GEMM output, or its dy
  float* block2;  // plan.out_floats: its dy in another layout
};

// Slot 0 holds each worker's columns and padded plane, slot 1 its output
// block followed by `extra_floats` more (for partial gradients).
struct Scratch {
  float* slot0;
  float* slot1;
  int64_t slot0_stride;
  int64_t slot1_stride;

  WorkerBuffers For(const Plan& plan, int t) const {
    float* s0 = slot0 + t * slot0_stride;
    float* s1 = slot1 + t * slot1_stride;
    return {s0, s0 + plan.cols_floats, s1, s1 + plan.out_floats};
  }
  float* Extra(const Plan& plan, int t) const {
    return slot1 + t * slot1_stride + 2 * plan.out_floats;
  }
};

absl::StatusOr<Scratch> GetScratch(CpuDevice& device, const Plan& plan, int64_t extra_floats) {
  Scratch scratch;
  scratch.slot0_stride = plan.cols_floats + plan.padded_floats;
  scratch.slot1_stride = 2 * plan.out_floats + extra_floats;
  PS_ASSIGN_OR_RETURN(scratch.slot0, ScratchFloats(device, 0, plan.workers * scratch.slot0_stride));
  PS_ASSIGN_OR_RETURN(scratch.slot1, ScratchFloats(device, 1, plan.workers * scratch.slot1_stride));
  return scratch;
}

// y (`count` samples of [channels, pixels]) = block ([channels] x
// [count * pixels]) + bias[channel] (bias may be null).
void BlockToNchw(const float* block, int64_t count, int64_t channels, int64_t pixels,
                 const float* bias, float* y) {
  const int64_t ld = count * pixels;
  for (int64_t s = 0; s < count; ++s) {
    for (int64_t c = 0; c < channels; ++c) {
      CopyAdd(block + c * ld + s * pixels, bias != nullptr ? bias[c] : 0.f,
              y + (s * channels + c) * pixels, pixels);
    }
  }
}

// The inverse layout change, also summing each channel into sums (when not
// null; added to it when `accumulate`, else overwriting it).
void NchwToBlock(const float* y, int64_t count, int64_t channels, int64_t pixels, float* block,
                 float* sums, bool accumulate) {
  const int64_t ld = count * pixels;
  for (int64_t c = 0; c < channels; ++c) {
    float sum = 0;
    for (int64_t s = 0; s < count; ++s) {
      sum += CopySum(y + (s * channels + c) * pixels, block + c * ld + s * pixels, pixels);
    }
    if (sums != nullptr) sums[c] = accumulate ? sums[c] + sum : sum;
  }
}

// dy transposed, pixel-major: dst[(s * pixels + p) * channels + c] = plane
// (s, c)'s pixel p, the planes `sample_stride` and `channel_stride` floats
// apart (NCHW: channels * pixels and pixels; the block layout: pixels and
// count * pixels). Also sums each channel into sums as NchwToBlock does.
void NchwToPixelMajor(const float* y, int64_t count, int64_t channels, int64_t pixels,
                      int64_t sample_stride, int64_t channel_stride, float* dst, float* sums,
                      bool accumulate) {
  for (int64_t s = 0; s < count; ++s) {
    const float* src = y + s * sample_stride;
    float* out = dst + s * pixels * channels;
    // Pixel outermost: each pixel's row of `channels` is written whole, while
    // the reads walk `channels` rows of one sample, all in L1.
    for (int64_t p = 0; p < pixels; ++p) {
      for (int64_t c = 0; c < channels; ++c) out[p * channels + c] = src[c * channel_stride + p];
    }
  }
  if (sums == nullptr) return;
  for (int64_t c = 0; c < channels; ++c) {
    float sum = 0;
    for (int64_t s = 0; s < count; ++s) {
      sum += Sum(y + s * sample_stride + c * channel_stride, pixels);
    }
    sums[c] = accumulate ? sums[c] + sum : sum;
  }
}

// The epilogue's forward for the block [O x count*P] (bias not yet added)
// of samples [n0, n0 + count): bias, activation and pooling plane by plane.
void EpilogueForward(const Geometry& g, int64_t n0, int64_t count, const float* block,
                     const float* bias, const ActivationPoolEpilogue& e, float* rows) {
  const int64_t ld = count * g.p;
  const int64_t pooled = e.pool.out_height() * e.pool.out_width();
  for (int64_t s = 0; s < count; ++s) {
    for (int64_t c = 0; c < g.o; ++c) {
      const float* plane = block + c * ld + s * g.p;
      const int64_t index = (n0 + s) * g.o + c;
      ActivationPoolPlaneForward(e.activation, e.max, e.pool, plane,
                                 bias != nullptr ? bias + c : nullptr, e.a + index * g.p,
                                 e.y + index * pooled,
                                 e.max ? e.argmax + index * pooled : nullptr, rows);
    }
  }
}

// The epilogue's backward: the dy of samples [n0, n0 + count) straight into
// the block layout [O x count*P] that the GEMMs read (no NCHW copy).
void EpilogueBackward(const Geometry& g, int64_t n0, int64_t count,
                      const ActivationPoolEpilogue& e, float* block, float* rows) {
  const int64_t ld = count * g.p;
  const int64_t pooled = e.pool.out_height() * e.pool.out_width();
  for (int64_t s = 0; s < count; ++s) {
    for (int64_t c = 0; c < g.o; ++c) {
      const int64_t index = (n0 + s) * g.o + c;
      ActivationPoolPlaneBackward(e.activation, e.max, e.pool, e.a_in + index * g.p,
                                  e.pooled_dy + index * pooled,
                                  e.max ? e.argmax_in + index * pooled : nullptr,
                                  block + c * ld + s * g.p, rows);
    }
  }
}

// Forward for samples [n0, n0 + count).
void ForwardBlock(const Geometry& g, int64_t n0, int64_t count, const float* x, const float* weight,
                  const float* bias, float* y, const WorkerBuffers& buf,
                  const ActivationPoolEpilogue* epilogue, float* rows) {
  const int64_t ld = count * g.p;
  const float* x0 = x + n0 * g.in_size;
  const float* columns = x0;
  if (!(g.pointwise && count == 1)) {
    Im2Col(g, x0, count, buf.cols, buf.padded);
    columns = buf.cols;
  }
  if (epilogue != nullptr) {
    GemmCpu(g.precision, false, false, g.o, ld, g.k, 1.f, weight, g.k, columns, ld, 0.f, buf.block,
            ld);
    EpilogueForward(g, n0, count, buf.block, bias, *epilogue, rows);
    return;
  }
  float* y0 = y + n0 * g.out_size;
  if (count == 1) {
    // One sample's [O x P] product is its NCHW output already.
    GemmCpu(g.precision, false, false, g.o, ld, g.k, 1.f, weight, g.k, columns, ld, 0.f, y0, ld);
    if (bias != nullptr) {
      for (int64_t oc = 0; oc < g.o; ++oc) AddScalar(bias[oc], y0 + oc * g.p, g.p);
    }
    return;
  }
  // block [O x count*P] = weight [O x K] * columns [K x count*P], then to
  // NCHW with the bias while the block is still in cache.
  GemmCpu(g.precision, false, false, g.o, ld, g.k, 1.f, weight, g.k, columns, ld, 0.f, buf.block,
          ld);
  BlockToNchw(buf.block, count, g.o, g.p, bias, y0);
}

// Backward for samples [n0, n0 + count). dw (O x K, or K x O when
// `transposed`) and db (when not null) are overwritten when `accumulate` is
// false, else added to.
// `dy0` is the block's own dy: NCHW (count samples), or when `dy_in_block`
// already in buf.block's layout [O x count*P] (the two agree for one sample).
void BackwardBlock(const Geometry& g, int64_t n0, int64_t count, const float* x,
                   const float* weight, const float* dy0, bool dy_in_block, float* dx, float* dw,
                   bool transposed, float* db, bool accumulate, const WorkerBuffers& buf) {
  const int64_t ld = count * g.p;
  const float* x0 = x + n0 * g.in_size;

  // 1. dy as one [O x count*P] matrix (with one sample, dy as stored),
  // summing each channel for dbias; when transposed also pixel-major
  // [count*P x O] for dweight's GEMM.
  const float* dy_block = dy0;
  if (count > 1 && dy_in_block) {
    // Summed sample by sample, as NchwToBlock does, so dbias is the same.
    for (int64_t c = 0; db != nullptr && c < g.o; ++c) {
      float sum = 0;
      for (int64_t s = 0; s < count; ++s) sum += Sum(dy0 + c * ld + s * g.p, g.p);
      db[c] = accumulate ? db[c] + sum : sum;
    }
  } else if (count > 1) {
    NchwToBlock(dy0, count, g.o, g.p, buf.block, db, accumulate);
    dy_block = buf.block;
  } else if (db != nullptr) {
    for (int64_t oc = 0; oc < g.o; ++oc) {
      const float sum = Sum(dy0 + oc * g.p, g.p);
      db[oc] = accumulate ? db[oc] + sum : sum;
    }
  }

  // 2. dweight [O x K] (+)= dy_block * columns^T, or its transpose
  // columns * dy (pixel-major).
  const bool direct = g.pointwise && count == 1;
  const float* columns = x0;
  if (!direct) {
    Im2Col(g, x0, count, buf.cols, buf.padded);
    columns = buf.cols;
  }
  const float beta = accumulate ? 1.f : 0.f;
  if (transposed) {
    if (dy_in_block) {
      NchwToPixelMajor(dy0, count, g.o, g.p, g.p, ld, buf.block2, nullptr, false);
    } else {
      NchwToPixelMajor(dy0, count, g.o, g.p, g.o * g.p, g.p, buf.block2, nullptr, false);
    }
    GemmCpu(g.precision, false, false, g.k, g.o, ld, 1.f, columns, ld, buf.block2, g.o, beta, dw,
            g.o);
  } else {
    GemmCpu(g.precision, false, true, g.o, g.k, ld, 1.f, dy_block, ld, columns, ld, beta, dw, g.k);
  }

  // 3. dx: the columns' gradient weight^T * dy, folded back onto the image
  // (the columns are no longer needed, so their buffer holds it).
  if (dx == nullptr) return;
  float* dx0 = dx + n0 * g.in_size;
  float* dcols = direct ? dx0 : buf.cols;
  GemmCpu(g.precision, true, false, g.k, ld, g.o, 1.f, weight, g.k, dy_block, ld, 0.f, dcols, ld);
  if (!direct) Col2Im(g, buf.cols, count, dx0, buf.padded);
}

}  // namespace

absl::Status Conv2dForwardCpu(CpuDevice& device, const Conv2dShape& shape, const float* x,
                              const float* weight, const float* bias, float* y,
                              const ActivationPoolEpilogue* epilogue) {
  const Geometry g(shape, device.gemm_precision());
  // A 1x1 image to a 1x1 output (ResNet-18's stage 4 on 28x28 input): only
  // tap (ph, pw) of each kernel lies inside the image, so y [N x O] =
  // x [N x C] * weight[:, :, ph, pw]^T, one GEMM over the taps that are
  // there instead of im2col's columns, 8/9 of them zeros for a padded 3x3.
  if (epilogue == nullptr && g.h == 1 && g.w == 1 && g.p == 1 && g.ph < g.kh && g.pw < g.kw &&
      !g.pointwise) {
    PS_ASSIGN_OR_RETURN(float* centre, ScratchFloats(device, 0, g.o * g.c));
    const int64_t taps = g.kh * g.kw, tap = g.ph * g.kw + g.pw;
    for (int64_t i = 0; i < g.o * g.c; ++i) centre[i] = weight[i * taps + tap];
    GemmCpu(g.precision, false, true, g.batch, g.o, g.c, 1.f, x, g.c, centre, g.c, 0.f, y, g.o);
    if (bias != nullptr) {
      for (int64_t n = 0; n < g.batch; ++n) Accumulate(bias, y + n * g.o, g.o);
    }
    return absl::OkStatus();
  }
  const Plan plan = MakePlan(g, device);
  PS_ASSIGN_OR_RETURN(const Scratch scratch, GetScratch(device, plan, 0));
  RunWorkers(device, plan.workers, [&](int t) {
    std::vector<float> rows(epilogue != nullptr ? g.ow : 0);
    for (int64_t b = plan.BlockBegin(t); b < plan.BlockBegin(t + 1); ++b) {
      const int64_t n0 = b * plan.block;
      const int64_t count = std::min(plan.block, g.batch - n0);
      ForwardBlock(g, n0, count, x, weight, bias, y, scratch.For(plan, t), epilogue,
                   rows.data());
    }
  });
  return absl::OkStatus();
}

absl::Status Conv2dBackwardCpu(CpuDevice& device, const Conv2dShape& shape, const float* x,
                               const float* weight, const float* dy, float* dx, float* dweight,
                               float* dbias, const ActivationPoolEpilogue* epilogue) {
  const Geometry g(shape, device.gemm_precision());
  const Plan plan = MakePlan(g, device);
  // OpenBLAS runs dweight's GEMM, whose depth is the block's pixels, at
  // different speeds depending on its orientation and operand layouts.
  // Measured on one AVX-512 core (OpenBLAS 0.3.21, SkylakeX kernels) for one
  // block of LeNet's conv2 (O = 16, K = 150, 300 pixels): 50 GFLOP/s as
  // dy [O x N] * columns^T, 75 as columns * dy^T, 85-120 as columns * dy
  // with dy pixel-major [N x O] (worth its extra transposing pass: conv2's
  // backward 10% faster). For conv1 (O = 6, K = 25) the first is best. The
  // pixel-major form wins once O fills the kernel's 16-wide register tile.
  const bool transposed = g.o >= 16;
  // Every worker sums its blocks' dweight and dbias into its own partials;
  // the partials are added (and transposed back) into the outputs at the end.
  const int64_t partial_floats = g.o * g.k + g.o;
  PS_ASSIGN_OR_RETURN(const Scratch scratch, GetScratch(device, plan, partial_floats));
  RunWorkers(device, plan.workers, [&](int t) {
    float* dw = scratch.Extra(plan, t);
    float* db = dbias != nullptr ? dw + g.o * g.k : nullptr;
    const WorkerBuffers buf = scratch.For(plan, t);
    std::vector<float> rows(epilogue != nullptr ? g.ow : 0);
    for (int64_t b = plan.BlockBegin(t); b < plan.BlockBegin(t + 1); ++b) {
      const int64_t n0 = b * plan.block;
      const int64_t count = std::min(plan.block, g.batch - n0);
      const float* dy0 = dy + n0 * g.out_size;
      // With an epilogue, the block's dy is formed in its GEMM layout.
      if (epilogue != nullptr) {
        EpilogueBackward(g, n0, count, *epilogue, buf.block, rows.data());
        dy0 = buf.block;
      }
      BackwardBlock(g, n0, count, x, weight, dy0, epilogue != nullptr, dx, dw, transposed, db,
                    b > plan.BlockBegin(t), buf);
    }
  });
  for (int t = 0; t < plan.workers; ++t) {
    const float* dw = scratch.Extra(plan, t);
    if (transposed) {
      for (int64_t oc = 0; oc < g.o; ++oc) {
        for (int64_t k = 0; k < g.k; ++k) {
          const float v = dw[k * g.o + oc];
          dweight[oc * g.k + k] = t == 0 ? v : dweight[oc * g.k + k] + v;
        }
      }
    } else if (t == 0) {
      std::memcpy(dweight, dw, g.o * g.k * sizeof(float));
    } else {
      Accumulate(dw, dweight, g.o * g.k);
    }
    if (dbias == nullptr) continue;
    if (t == 0) {
      std::memcpy(dbias, dw + g.o * g.k, g.o * sizeof(float));
    } else {
      Accumulate(dw + g.o * g.k, dbias, g.o);
    }
  }
  return absl::OkStatus();
}

}  // namespace ps::kernels::internal
