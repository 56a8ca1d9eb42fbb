#include "kernels/conv_dnnl.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace ps::kernels::internal {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;

using Pass = DnnlPass;

// One argument of a primitive: the user's NCHW/OIHW/x buffer and the method
// the primitive wants, with the reorder between them when they differ.
struct Arg {
  int dnnl_arg;
  bool output;
  memory::desc user_md;
  memory::desc prim_md;
  std::optional<dnnl::reorder> reorder;  // user -> prim for inputs, prim -> user for outputs
};

struct Entry {
  dnnl::primitive primitive;
  std::vector<Arg> args;
  memory::desc scratchpad_md;
  std::string implementation;  // oneDNN's name for the primitive's kernel
  int64_t scratch_bytes = 0;  // scratchpad and reordered arguments, each aligned
};

// Key: the part's eleven sizes, then pass, bias, method and the whole
// tensor's output channels (the stride of a part's dy, see Part).
using Key = std::array<int64_t, 15>;

constexpr int64_t kAlign = 64;

int64_t Aligned(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

const dnnl::engine& Engine() {
  static const dnnl::engine* engine = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *engine;
}

Arg MakeArg(int dnnl_arg, bool output, const memory::desc& user_md,
            const memory::desc& prim_md) {
  Arg arg{dnnl_arg, output, user_md, prim_md, std::nullopt};
  if (user_md != prim_md) {
    const dnnl::engine& e = Engine();
    arg.reorder = output ? dnnl::reorder(dnnl::reorder::primitive_desc(e, prim_md, e, user_md))
                         : dnnl::reorder(dnnl::reorder::primitive_desc(e, user_md, e, prim_md));
  }
  return arg;
}

// `s` is one part of the layer (a slice of the batch, or of the output
// channels for the weight gradient); `total_out_channels` is the layer's, so
// that a channel slice of dy is described in place with its NCHW strides.
std::unique_ptr<Entry> CreateEntry(const Conv2dShape& s, Pass pass, bool bias, DnnlMethod method,
                                   int64_t total_out_channels) {
  const int64_t oh = s.out_height(), ow = s.out_width();
  const memory::dims src_dims = {s.batch, s.in_channels, s.height, s.width};
  const memory::dims w_dims = {s.out_channels, s.in_channels, s.kernel_h, s.kernel_w};
  const memory::dims b_dims = {s.out_channels};
  const memory::dims dst_dims = {s.batch, s.out_channels, oh, ow};
  const memory::dims strides = {s.stride_h, s.stride_w};
  const memory::dims pad = {s.pad_h, s.pad_w};
  const auto f32 = memory::data_type::f32;
  const memory::desc user_src(src_dims, f32, Tag::nchw);
  const memory::desc user_w(w_dims, f32, Tag::oihw);
  const memory::desc user_b(b_dims, f32, Tag::x);
  const memory::desc user_dst(dst_dims, f32,
                              memory::dims{total_out_channels * oh * ow, oh * ow, ow, 1});
  const memory::desc dense_dst(dst_dims, f32, Tag::nchw);
  const bool any = method != DnnlMethod::kPlain;
  const memory::desc src = any ? memory::desc(src_dims, f32, Tag::any) : user_src;
  const memory::desc w = any ? memory::desc(w_dims, f32, Tag::any) : user_w;
  const memory::desc dst = any ? memory::desc(dst_dims, f32, Tag::any) : dense_dst;
  const auto alg = method == DnnlMethod::kWinograd ? dnnl::algorithm::convolution_winograd
                                                   : dnnl::algorithm::convolution_direct;
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);

  // Every backward primitive descriptor needs a training forward one as a
  // hint.
  const auto fwd_desc =
      bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, src, w,
                                             user_b, dst, strides, pad, pad)
           : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, src, w, dst,
                                             strides, pad, pad);
  const dnnl::convolution_forward::primitive_desc fwd(fwd_desc, attr, Engine());
  auto entry = std::make_unique<Entry>();
  switch (pass) {
    case Pass::kForward: {
      // An inference primitive: a convolution's training forward computes
      // nothing more; except for Winograd, whose inference primitive wants
      // its weights already transformed into tiles (a reorder per call,
      // measured 2x slower than the whole training forward, which
      // transforms them in its own kernel).
      const auto prop = method == DnnlMethod::kWinograd ? dnnl::prop_kind::forward_training
                                                        : dnnl::prop_kind::forward_inference;
      const auto desc =
          bias ? dnnl::convolution_forward::desc(prop, alg, src, w, user_b, dst, strides, pad,
                                                 pad)
               : dnnl::convolution_forward::desc(prop, alg, src, w, dst, strides, pad, pad);
      const dnnl::convolution_forward::primitive_desc pd(desc, attr, Engine());
      entry->primitive = dnnl::convolution_forward(pd);
      entry->scratchpad_md = pd.scratchpad_desc();
      entry->implementation = pd.impl_info_str();
      entry->args.push_back(MakeArg(DNNL_ARG_SRC, false, user_src, pd.src_desc()));
      entry->args.push_back(MakeArg(DNNL_ARG_WEIGHTS, false, user_w, pd.weights_desc()));
      if (bias) entry->args.push_back(MakeArg(DNNL_ARG_BIAS, false, user_b, pd.bias_desc()));
      entry->args.push_back(MakeArg(DNNL_ARG_DST, true, user_dst, pd.dst_desc()));
      break;
    }
    case Pass::kBackwardData: {
      const dnnl::convolution_backward_data::primitive_desc bwd(
          dnnl::convolution_backward_data::desc(alg, src, w, dst, strides, pad, pad), attr,
          Engine(), fwd);
      entry->primitive = dnnl::convolution_backward_data(bwd);
      entry->scratchpad_md = bwd.scratchpad_desc();
      entry->implementation = bwd.impl_info_str();
      entry->args.push_back(MakeArg(DNNL_ARG_DIFF_DST, false, user_dst, bwd.diff_dst_desc()));
      entry->args.push_back(MakeArg(DNNL_ARG_WEIGHTS, false, user_w, bwd.weights_desc()));
      entry->args.push_back(MakeArg(DNNL_ARG_DIFF_SRC, true, user_src, bwd.diff_src_desc()));
      break;
    }
    case Pass::kBackwardWeights: {
      const auto desc =
          bias ? dnnl::convolution_backward_weights::desc(alg, src, w, user_b, dst, strides, pad,
                                                          pad)
               : dnnl::convolution_backward_weights::desc(alg, src, w, dst, strides, pad, pad);
      const dnnl::convolution_backward_weights::primitive_desc bwd(desc, attr, Engine(), fwd);
      entry->primitive = dnnl::convolution_backward_weights(bwd);
      entry->scratchpad_md = bwd.scratchpad_desc();
      entry->implementation = bwd.impl_info_str();
      entry->args.push_back(MakeArg(DNNL_ARG_SRC, false, user_src, bwd.src_desc()));
      entry->args.push_back(MakeArg(DNNL_ARG_DIFF_DST, false, user_dst, bwd.diff_dst_desc()));
      entry->args.push_back(
          MakeArg(DNNL_ARG_DIFF_WEIGHTS, true, user_w, bwd.diff_weights_desc()));
      if (bias) {
        entry->args.push_back(
            MakeArg(DNNL_ARG_DIFF_BIAS, true, user_b, bwd.diff_bias_desc()));
      }
      break;
    }
  }
  entry->scratch_bytes = Aligned(static_cast<int64_t>(entry->scratchpad_md.get_size()));
  for (const Arg& arg : entry->args) {
    if (arg.reorder) entry->scratch_bytes += Aligned(static_cast<int64_t>(arg.prim_md.get_size()));
  }
  return entry;
}

// The process's memo of primitives (see conv_dnnl.h). Entries are never
// removed, so a returned pointer stays valid.
class PrimitiveMemo {
 public:
  const Entry* Get(const Conv2dShape& s, Pass pass, bool bias, DnnlMethod method,
                   int64_t total_out_channels) {
    const Key key = {s.batch,
                     s.in_channels,
                     s.height,
                     s.width,
                     s.out_channels,
                     s.kernel_h,
                     s.kernel_w,
                     s.stride_h,
                     s.stride_w,
                     s.pad_h,
                     s.pad_w,
                     static_cast<int64_t>(pass),
                     bias,
                     static_cast<int64_t>(method),
                     total_out_channels};
    std::lock_guard<std::mutex> lock(mu_);
    std::unique_ptr<Entry>& entry = entries_[key];
    if (entry == nullptr) {
      try {
        entry = CreateEntry(s, pass, bias, method, total_out_channels);
      } catch (const dnnl::error& e) {
        // Winograd's kernels take fewer shapes than WinogradApplies can
        // tell (a part's size, the CPU's ISA): where oneDNN has none for
        // this part, the direct primitive computes it.
        if (method != DnnlMethod::kWinograd || e.status != dnnl_unimplemented) throw;
        entry = CreateEntry(s, pass, bias, DnnlMethod::kBlocked, total_out_channels);
      }
    }
    return entry.get();
  }

 private:
  std::mutex mu_;
  std::map<Key, std::unique_ptr<Entry>> entries_;
};

PrimitiveMemo& Memo() {
  static PrimitiveMemo* memo = new PrimitiveMemo;
  return *memo;
}

// Runs the entry's primitive on one thread of OpenMP (the calling one) on
// the user's buffers (`user[i]` for entry.args[i]), reordering through
// `scratch` (entry.scratch_bytes, aligned) where the layouts differ.
void Execute(const Entry& entry, const std::vector<void*>& user, char* scratch) {
  omp_set_num_threads(1);
  const dnnl::engine& engine = Engine();
  dnnl::stream stream(engine);
  std::unordered_map<int, memory> args;
  args.emplace(DNNL_ARG_SCRATCHPAD, memory(entry.scratchpad_md, engine, scratch));
  char* next = scratch + Aligned(static_cast<int64_t>(entry.scratchpad_md.get_size()));
  std::vector<std::pair<memory, memory>> outputs;  // (primitive's, user's)
  for (size_t i = 0; i < entry.args.size(); ++i) {
    const Arg& arg = entry.args[i];
    memory user_mem(arg.user_md, engine, user[i]);
    if (!arg.reorder) {
      args.emplace(arg.dnnl_arg, user_mem);
      continue;
    }
    memory prim_mem(arg.prim_md, engine, next);
    next += Aligned(static_cast<int64_t>(arg.prim_md.get_size()));
    if (arg.output) {
      outputs.emplace_back(prim_mem, user_mem);
    } else {
      arg.reorder->execute(stream, user_mem, prim_mem);
    }
    args.emplace(arg.dnnl_arg, prim_mem);
  }
  entry.primitive.execute(stream, args);
  size_t o = 0;
  for (const Arg& arg : entry.args) {
    if (arg.output && arg.reorder) {
      arg.reorder->execute(stream, outputs[o].first, outputs[o].second);
      ++o;
    }
  }
  stream.wait();
}

// One thread's share of a layer: its shape and its arguments' pointers.
struct Part {
  Conv2dShape shape;
  std::vector<void*> user;
  const Entry* entry = nullptr;
};

// Runs the parts on the device's threads, one part per thread, each with its
// own share of scratch slot 0. Primitives are looked up (and created) on the
// calling thread first.
absl::Status RunParts(CpuDevice& device, Pass pass, bool bias, DnnlMethod method,
                      int64_t total_out_channels, std::vector<Part>& parts, const char* what) {
  try {
    // Primitives are tuned for the OpenMP team size of the thread creating
    // them: one, as they run.
    omp_set_num_threads(1);
    int64_t stride = 0;
    for (Part& part : parts) {
      part.entry = Memo().Get(part.shape, pass, bias, method, total_out_channels);
      stride = std::max(stride, Aligned(part.entry->scratch_bytes));
    }
    PS_ASSIGN_OR_RETURN(void* scratch,
                        device.Scratch(0, stride * static_cast<int64_t>(parts.size()) + kAlign));
    char* base = reinterpret_cast<char*>(
        (reinterpret_cast<uintptr_t>(scratch) + kAlign - 1) / kAlign * kAlign);
    if (parts.size() == 1) {
      Execute(*parts[0].entry, parts[0].user, base);
      return absl::OkStatus();
    }
    // Errors on the pool threads are caught there and reported here.
    std::vector<std::string> errors(parts.size());
    device.ParallelFor(static_cast<int64_t>(parts.size()), 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        try {
          Execute(*parts[i].entry, parts[i].user, base + i * stride);
        } catch (const dnnl::error& e) {
          errors[i] = e.what();
        }
      }
    });
    for (const std::string& e : errors) {
      if (!e.empty()) return absl::InternalError(absl::StrCat(what, ": oneDNN: ", e));
    }
    return absl::OkStatus();
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat(what, ": oneDNN: ", e.what(), " (status ",
                                            static_cast<int>(e.status), ")"));
  }
}

void* Mutable(const float* p) { return const_cast<float*>(p); }

// [begin, end) ranges cutting n into at most `threads` parts, each a
// multiple of `unit` long except the last.
std::vector<std::pair<int64_t, int64_t>> Split(int64_t n, int threads, int64_t unit) {
  const int64_t units = (n + unit - 1) / unit;
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(threads, units));
  const int64_t per = (units + parts - 1) / parts * unit;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (int64_t b = 0; b < n; b += per) ranges.emplace_back(b, std::min(n, b + per));
  return ranges;
}

// Output channels per part of the weight gradient: whole 16-channel blocks.
constexpr int64_t kChannelBlock = 16;

}  // namespace

// Measured per ResNet-18 layer by kernels/conv_benchmark.cc (README,
// Benchmarks). Backward: oneDNN's blocked direct convolution, reorders
// included, beats im2col + GEMM on every layer with at least 32 output
// channels (up to 6x on stage 4's 1x1 images, where 8 of the 9 taps fall in
// the padding that im2col multiplies anyway), except dx with fewer than 16
// input channels (the 1-channel stem, whose dx a model skips).
//
// Forward (batch 64 and 256, one and two threads, against im2col + oneDNN's
// sgemm): the blocked primitive is 1.3-3x faster on ResNet's 3x3 layers
// whose output keeps at least 4 pixels per unit of stride squared (stage 1,
// stage 2, stage 3's stride-1 layers and stage 2's stride-2 entry), and
// slower on the strided entries to stages 3 and 4 (2x2 and 1x1 outputs),
// on the 1x1 shortcut convolutions (1.4-17x slower) and on stage 4's 1x1
// images (our one-tap GEMM, 4-10x faster); the stem (1 input channel) is a
// tie. (Its choice once seemed to make pytorch_parity_test's three ResNet-18
// steps drift from PyTorch's; the drift was float32 ill-conditioning, which
// PyTorch's own two float32 convolutions show too: see that test.)
//
// LeNet's narrow layers (6 and 16 output channels) stay ours either way,
// which keeps the fused kernels bit-identical to an unfused Conv2d there.
//
// Winograd F(4x4, 3x3) (batch 64, one thread, reorders included; the
// forward as a training primitive, see CreateEntry): 1.4-2.2x faster than
// the blocked direct primitive forward and 1.3-2.8x on the backward on
// every 3x3 stride-1 layer whose output holds at least one whole 4x4 tile
// (resnet18's 7x7 and 4x4 stages, all of resnet18_cifar's stride-1 layers
// from 28x28 to 4x4), and 2-8x slower on 2x2 and 1x1 outputs, where most of
// each tile is padding.
//
// All of that was measured on CPUs with AVX-512, and only there is oneDNN
// chosen. On an AVX2-only CPU (AMD EPYC, Zen 3 class, session of 2026-12-02
// 04:20 UTC) its forward was mixed (batch 64, one thread: 5-22 % faster on
// stage 1-2's 3x3 layers, 2-2.6x slower on the strided and 1x1 ones), and
// with it ResNet-18's one step against PyTorch (model_test's
// OneStepMatchesTorch) missed its tolerance on stage 1's batch-norm
// gradients by 2-3x, where im2col + GEMM passes on the same machine.
bool WinogradApplies(const Conv2dShape& shape) {
  return shape.kernel_h == 3 && shape.kernel_w == 3 && shape.stride_h == 1 &&
         shape.stride_w == 1 && shape.pad_h <= 1 && shape.pad_w <= 1 &&
         shape.in_channels % kChannelBlock == 0 && shape.out_channels % kChannelBlock == 0;
}

bool DnnlConvMeasuredHere() {
  static const bool avx512 = __builtin_cpu_supports("avx512f") != 0;
  return avx512;
}

namespace {

// The measured domain of Winograd (above): whole 4x4 output tiles, and the
// channel counts of ResNet's layers.
bool PreferWinograd(const Conv2dShape& shape) {
  return WinogradApplies(shape) && shape.out_height() >= 4 && shape.out_width() >= 4 &&
         shape.in_channels >= 16 && shape.out_channels >= 32;
}

}  // namespace

bool PreferDnnlConvForward(const Conv2dShape& shape, DnnlMethod* method) {
  *method = DnnlMethod::kBlocked;
  if (!DnnlConvMeasuredHere()) return false;
  if (PreferWinograd(shape)) {
    *method = DnnlMethod::kWinograd;
    return true;
  }
  const int64_t pixels = shape.out_height() * shape.out_width();
  return shape.kernel_h * shape.kernel_w > 1 && shape.out_channels >= 32 &&
         shape.in_channels >= 16 && pixels >= 4 * shape.stride_h * shape.stride_w;
}

bool PreferDnnlConvBackward(const Conv2dShape& shape, bool need_dx, DnnlMethod* method) {
  *method = DnnlMethod::kBlocked;
  if (!DnnlConvMeasuredHere()) return false;
  if (PreferWinograd(shape)) {
    *method = DnnlMethod::kWinograd;
    return true;
  }
  return shape.out_channels >= 32 && !(need_dx && shape.in_channels < 16);
}

absl::Status Conv2dForwardDnnl(CpuDevice& device, const Conv2dShape& shape, DnnlMethod method,
                               const float* x, const float* weight, const float* bias, float* y) {
  // Each thread runs a slice of the batch.
  const int64_t in_size = shape.in_channels * shape.height * shape.width;
  const int64_t out_size = shape.out_channels * shape.out_height() * shape.out_width();
  std::vector<Part> parts;
  for (const auto& [n0, n1] : Split(shape.batch, device.num_threads(), 1)) {
    Part part{shape, {Mutable(x + n0 * in_size), Mutable(weight)}};
    part.shape.batch = n1 - n0;
    if (bias != nullptr) part.user.push_back(Mutable(bias));
    part.user.push_back(y + n0 * out_size);
    parts.push_back(std::move(part));
  }
  return RunParts(device, Pass::kForward, bias != nullptr, method, shape.out_channels, parts,
                  "Conv2dForwardDnnl");
}

absl::Status Conv2dBackwardDnnl(CpuDevice& device, const Conv2dShape& shape, DnnlMethod method,
                                const float* x, const float* weight, const float* dy, float* dx,
                                float* dweight, float* dbias) {
  const int64_t in_size = shape.in_channels * shape.height * shape.width;
  const int64_t pixels = shape.out_height() * shape.out_width();
  const int64_t out_size = shape.out_channels * pixels;
  if (dx != nullptr) {
    // dx: each thread a slice of the batch.
    std::vector<Part> parts;
    for (const auto& [n0, n1] : Split(shape.batch, device.num_threads(), 1)) {
      Part part{shape, {Mutable(dy + n0 * out_size), Mutable(weight), dx + n0 * in_size}};
      part.shape.batch = n1 - n0;
      parts.push_back(std::move(part));
    }
    PS_RETURN_IF_ERROR(RunParts(device, Pass::kBackwardData, false, method, shape.out_channels,
                                parts, "Conv2dBackwardDnnl (data)"));
  }
  // dweight and dbias: each thread a slice of the output channels (its rows
  // of dweight and dbias, read from its channels of dy in place), so no
  // thread's partial sums need adding up and the result does not depend on
  // the thread count.
  const int64_t w_size = shape.in_channels * shape.kernel_h * shape.kernel_w;
  std::vector<Part> parts;
  for (const auto& [o0, o1] : Split(shape.out_channels, device.num_threads(), kChannelBlock)) {
    Part part{shape, {Mutable(x), Mutable(dy + o0 * pixels), dweight + o0 * w_size}};
    part.shape.out_channels = o1 - o0;
    if (dbias != nullptr) part.user.push_back(dbias + o0);
    parts.push_back(std::move(part));
  }
  return RunParts(device, Pass::kBackwardWeights, dbias != nullptr, method, shape.out_channels,
                  parts, "Conv2dBackwardDnnl (weights)");
}

absl::StatusOr<std::string> DnnlConvImplementation(const Conv2dShape& shape, DnnlPass pass,
                                                   DnnlMethod method) {
  try {
    omp_set_num_threads(1);
    return Memo().Get(shape, pass, false, method, shape.out_channels)->implementation;
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("DnnlConvImplementation: oneDNN: ", e.what()));
  }
}

}  // namespace ps::kernels::internal
