#include "kernels/half_gemm_cpu.h"

#include <immintrin.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/types/span.h"
#include "common/half.h"
#include "kernels/gemm.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace ps::kernels::internal {
namespace {

using dnnl::memory;

// --- rounding ---------------------------------------------------------------

__attribute__((target("avx512f,avx512bf16,avx512vl"))) void RoundRowToBfloat16Avx512(
    const float* src, int64_t n, uint16_t* dst) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256bh packed = _mm512_cvtneps_pbh(_mm512_loadu_ps(src + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), reinterpret_cast<__m256i>(packed));
  }
  for (; i < n; ++i) dst[i] = FloatToBfloat16(src[i]);
}

__attribute__((target("avx,f16c"))) void RoundRowToHalfF16c(const float* src, int64_t n,
                                                            float* dst) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i half =
        _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(half));
  }
  for (; i < n; ++i) dst[i] = HalfToFloat(FloatToHalf(src[i]));
}

bool HasAvx512Bf16() {
  static const bool has = __builtin_cpu_supports("avx512bf16") != 0;
  return has;
}

bool HasF16c() {
  static const bool has = __builtin_cpu_supports("f16c") != 0;
  return has;
}

// --- the bf16 matmul primitive ------------------------------------------------

struct Matmul {
  dnnl::matmul primitive;
  memory::desc a_md, b_md, c_md, scratchpad_md;
};

// m, n, k, the transposes, ldc, alpha and beta (as bits) and the OpenMP team
// size the primitive is created for (oneDNN tunes a primitive for its
// creator's team).
using Key = std::array<int64_t, 9>;

const dnnl::engine& Engine() {
  static const dnnl::engine* engine = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *engine;
}

// A packed operand is stored as its rows were: op(A) (m x k) has strides
// {k, 1}, or {1, m} when A is stored transposed; op(B) (k x n) likewise.
std::unique_ptr<Matmul> CreateMatmul(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                                     float alpha, float beta, int64_t ldc) {
  const auto bf16 = memory::data_type::bf16;
  auto mm = std::make_unique<Matmul>();
  mm->a_md = memory::desc({m, k}, bf16, trans_a ? memory::dims{1, m} : memory::dims{k, 1});
  mm->b_md = memory::desc({k, n}, bf16, trans_b ? memory::dims{1, k} : memory::dims{n, 1});
  mm->c_md = memory::desc({m, n}, memory::data_type::f32, memory::dims{ldc, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (alpha != 1.f) attr.set_output_scales(0, {alpha});
  if (beta != 0.f) {
    dnnl::post_ops ops;
    ops.append_sum(beta);
    attr.set_post_ops(ops);
  }
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(mm->a_md, mm->b_md, mm->c_md), attr,
                                        Engine());
  mm->primitive = dnnl::matmul(pd);
  mm->scratchpad_md = pd.scratchpad_desc();
  return mm;
}

// The process's memo of matmul primitives, one per GEMM shape the trainer
// runs (a model has a few dozen). Entries are never removed, so a returned
// pointer stays valid.
class MatmulMemo {
 public:
  const Matmul& Get(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    float beta, int64_t ldc, int threads) {
    const Key key = {m,
                     n,
                     k,
                     trans_a,
                     trans_b,
                     ldc,
                     ps::internal::FloatBits(alpha),
                     ps::internal::FloatBits(beta),
                     threads};
    std::lock_guard<std::mutex> lock(mu_);
    std::unique_ptr<Matmul>& entry = entries_[key];
    if (entry == nullptr) entry = CreateMatmul(trans_a, trans_b, m, n, k, alpha, beta, ldc);
    return *entry;
  }

 private:
  std::mutex mu_;
  std::map<Key, std::unique_ptr<Matmul>> entries_;
};

MatmulMemo& Memo() {
  static MatmulMemo* memo = new MatmulMemo;
  return *memo;
}

// The calling thread's packed operands and scratchpad, grown and never shrunk
// (a training loop runs the same shapes every step), its stream, and for each
// primitive it ran the memory objects it runs it on (re-pointed each call):
// creating those per call cost as much as a small GEMM.
struct ThreadMemories {
  memory a, b, c, scratchpad;
};

struct ThreadBuffers {
  std::vector<uint16_t> a16, b16;
  std::vector<float> a32, b32;
  std::vector<char> scratchpad;
  std::unique_ptr<dnnl::stream> stream;
  std::map<const Matmul*, ThreadMemories> memories;
};

ThreadBuffers& Buffers() {
  thread_local ThreadBuffers buffers;
  return buffers;
}

template <typename T>
T* Grown(std::vector<T>& v, int64_t size) {
  if (static_cast<int64_t>(v.size()) < size) v.resize(size);
  return v.data();
}

void Bf16Gemm(int threads, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
              int64_t ldc) {
  ThreadBuffers& buffers = Buffers();
  uint16_t* a16 = Grown(buffers.a16, m * k);
  uint16_t* b16 = Grown(buffers.b16, k * n);
  RoundToBfloat16(a, trans_a ? k : m, trans_a ? m : k, lda, a16);
  RoundToBfloat16(b, trans_b ? n : k, trans_b ? k : n, ldb, b16);
  try {
    const Matmul& mm = Memo().Get(trans_a, trans_b, m, n, k, alpha, beta, ldc, threads);
    char* scratch = Grown(buffers.scratchpad, static_cast<int64_t>(mm.scratchpad_md.get_size()));
    const dnnl::engine& engine = Engine();
    if (buffers.stream == nullptr) buffers.stream = std::make_unique<dnnl::stream>(engine);
    auto [it, added] = buffers.memories.try_emplace(&mm);
    ThreadMemories& mem = it->second;
    if (added) {
      mem = {memory(mm.a_md, engine, a16), memory(mm.b_md, engine, b16), memory(mm.c_md, engine, c),
             memory(mm.scratchpad_md, engine, scratch)};
    } else {
      mem.a.set_data_handle(a16);
      mem.b.set_data_handle(b16);
      mem.c.set_data_handle(c);
      mem.scratchpad.set_data_handle(scratch);
    }
    mm.primitive.execute(*buffers.stream, {{DNNL_ARG_SRC, mem.a},
                                           {DNNL_ARG_WEIGHTS, mem.b},
                                           {DNNL_ARG_DST, mem.c},
                                           {DNNL_ARG_SCRATCHPAD, mem.scratchpad}});
    buffers.stream->wait();
  } catch (const dnnl::error& e) {
    // The sizes were checked, the descriptors are plain strided matrices and
    // this CPU has a bf16 matmul (OneDnnHasBf16Matmul): a failure is a bug.
    std::fprintf(stderr, "oneDNN bf16 matmul failed: %s (m=%lld n=%lld k=%lld)\n", e.what(),
                 static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k));
    std::abort();
  }
}

// oneDNN 2.6 has a bf16 matmul only on CPUs with AVX-512 (avx512_core and
// up); on others (an AVX2-only AMD Zen 3, for one) creating the primitive
// fails with "could not create a primitive descriptor iterator". Asked once,
// with a 1 x 1 x 1 matmul.
bool OneDnnHasBf16Matmul() {
  static const bool has = [] {
    try {
      CreateMatmul(false, false, 1, 1, 1, 1.f, 0.f, 1);
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return has;
}

// Rounds rows x cols floats (row r at src + r * ld) to a narrower type and
// back to fp32, packed (row r at dst + r * cols).
using RoundFn = void (*)(const float* src, int64_t rows, int64_t cols, int64_t ld, float* dst);

// Without oneDNN's bf16 matmul (no AVX-512, so no AVX512-BF16 converter
// either): each value through common/half.h's bf16 and back.
void RoundToBfloat16AsFloat(const float* src, int64_t rows, int64_t cols, int64_t ld,
                            float* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = src + r * ld;
    float* out = dst + r * cols;
    for (int64_t i = 0; i < cols; ++i) out[i] = Bfloat16ToFloat(FloatToBfloat16(in[i]));
  }
}

// The operands rounded by `round`, kept as fp32 (exactly), and multiplied by
// the fp32 GEMM. A product of two bf16 (8-bit significands) or fp16 (11-bit)
// values is exact in fp32 and the sums are fp32, so this is the narrow
// type's storage with fp32 arithmetic: for bf16 it differs from oneDNN's
// bf16 matmul only in the order of the additions.
void RoundedGemm(RoundFn round, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                 float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                 float* c, int64_t ldc) {
  ThreadBuffers& buffers = Buffers();
  float* a32 = Grown(buffers.a32, m * k);
  float* b32 = Grown(buffers.b32, k * n);
  const int64_t a_cols = trans_a ? m : k;
  const int64_t b_cols = trans_b ? k : n;
  round(a, trans_a ? k : m, a_cols, lda, a32);
  round(b, trans_b ? n : k, b_cols, ldb, b32);
  GemmCpu(Precision::kFp32, trans_a, trans_b, m, n, k, alpha, a32, a_cols, b32, b_cols, beta, c,
          ldc);
}

}  // namespace

void RoundToBfloat16(const float* src, int64_t rows, int64_t cols, int64_t ld, uint16_t* dst) {
  const bool avx512 = HasAvx512Bf16();
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = src + r * ld;
    uint16_t* out = dst + r * cols;
    if (avx512) {
      RoundRowToBfloat16Avx512(in, cols, out);
    } else {
      FloatToBfloat16(absl::MakeConstSpan(in, cols), absl::MakeSpan(out, cols));
    }
  }
}

void RoundToHalf(const float* src, int64_t rows, int64_t cols, int64_t ld, float* dst) {
  const bool f16c = HasF16c();
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = src + r * ld;
    float* out = dst + r * cols;
    if (f16c) {
      RoundRowToHalfF16c(in, cols, out);
    } else {
      for (int64_t i = 0; i < cols; ++i) out[i] = HalfToFloat(FloatToHalf(in[i]));
    }
  }
}

void HalfGemmCpu(Precision precision, int threads, bool trans_a, bool trans_b, int64_t m, int64_t n,
                 int64_t k, float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
                 float beta, float* c, int64_t ldc) {
  if (precision == Precision::kBf16 && OneDnnHasBf16Matmul()) {
    Bf16Gemm(threads, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  } else {
    RoundedGemm(precision == Precision::kBf16 ? RoundToBfloat16AsFloat : RoundToHalf, trans_a,
                trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
}

}  // namespace ps::kernels::internal
