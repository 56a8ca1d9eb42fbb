#include "common/wire_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/half.h"

namespace ps {
namespace {

int64_t PiecesBytes(absl::Span<const absl::string_view> pieces) {
  int64_t n = 0;
  for (absl::string_view p : pieces) n += static_cast<int64_t>(p.size());
  return n;
}

// Calls fn(bytes, size) over the pieces' bytes as whole `width`-byte
// elements: straight from a piece where an element lies inside it, through
// a small carry buffer where one straddles two.
template <typename Fn>
void ForEachElement(absl::Span<const absl::string_view> pieces, size_t width, Fn fn) {
  char carry[8];
  size_t carried = 0;
  int64_t index = 0;
  for (absl::string_view p : pieces) {
    size_t at = 0;
    if (carried > 0) {
      const size_t take = std::min(width - carried, p.size());
      std::memcpy(carry + carried, p.data(), take);
      carried += take;
      at = take;
      if (carried < width) continue;
      fn(index++, carry);
      carried = 0;
    }
    for (; at + width <= p.size(); at += width) fn(index++, p.data() + at);
    carried = p.size() - at;
    std::memcpy(carry, p.data() + at, carried);
  }
}

class Fp32Codec final : public WireCodec {
 public:
  absl::string_view name() const override { return "none"; }
  DType dtype() const override { return DType::kF32; }
  int64_t EncodedBytes(int64_t elements) const override { return 4 * elements; }
  void Encode(absl::Span<const float> in, absl::Span<float> residual,
              void* out) const override {
    if (residual.empty()) {
      std::memcpy(out, in.data(), in.size() * sizeof(float));
      return;
    }
    char* dst = static_cast<char*>(out);
    for (size_t i = 0; i < in.size(); ++i) {
      const float x = in[i] + residual[i];
      std::memcpy(dst + 4 * i, &x, 4);
      residual[i] = 0.f;  // exact: nothing lost
    }
  }
  absl::Status Decode(absl::Span<const absl::string_view> pieces,
                      absl::Span<float> out) const override {
    if (PiecesBytes(pieces) != EncodedBytes(static_cast<int64_t>(out.size()))) {
      return SizeError(pieces, out.size());
    }
    char* dst = reinterpret_cast<char*>(out.data());
    for (absl::string_view p : pieces) {
      std::memcpy(dst, p.data(), p.size());
      dst += p.size();
    }
    return absl::OkStatus();
  }

  absl::Status SizeError(absl::Span<const absl::string_view> pieces, size_t elements) const {
    return absl::InvalidArgumentError(absl::StrCat(PiecesBytes(pieces), " bytes of ", name(),
                                                   " data for ", elements, " elements (",
                                                   EncodedBytes(static_cast<int64_t>(elements)),
                                                   " expected)"));
  }
};

// fp16 or bf16: 2 bytes per element, through common/half.h.
class HalfCodec final : public WireCodec {
 public:
  explicit HalfCodec(DType dtype) : dtype_(dtype) {}
  absl::string_view name() const override { return dtype_ == DType::kF16 ? "fp16" : "bf16"; }
  DType dtype() const override { return dtype_; }
  int64_t EncodedBytes(int64_t elements) const override { return 2 * elements; }
  void Encode(absl::Span<const float> in, absl::Span<float> residual,
              void* out) const override {
    // Element by element into possibly unaligned bytes.
    char* dst = static_cast<char*>(out);
    const bool f16 = dtype_ == DType::kF16;
    for (size_t i = 0; i < in.size(); ++i) {
      const float x = residual.empty() ? in[i] : in[i] + residual[i];
      const uint16_t bits = f16 ? FloatToHalf(x) : FloatToBfloat16(x);
      std::memcpy(dst + 2 * i, &bits, 2);
      if (!residual.empty()) residual[i] = x - (f16 ? HalfToFloat(bits) : Bfloat16ToFloat(bits));
    }
  }
  absl::Status Decode(absl::Span<const absl::string_view> pieces,
                      absl::Span<float> out) const override {
    const int64_t bytes = PiecesBytes(pieces);
    if (bytes != EncodedBytes(static_cast<int64_t>(out.size()))) {
      return absl::InvalidArgumentError(absl::StrCat(bytes, " bytes of ", name(), " data for ",
                                                     out.size(), " elements (",
                                                     2 * out.size(), " expected)"));
    }
    const bool f16 = dtype_ == DType::kF16;
    ForEachElement(pieces, 2, [&](int64_t i, const char* p) {
      uint16_t bits;
      std::memcpy(&bits, p, 2);
      out[i] = f16 ? HalfToFloat(bits) : Bfloat16ToFloat(bits);
    });
    return absl::OkStatus();
  }

 private:
  const DType dtype_;
};

// The largest `fraction` of a chunk by magnitude, as (index, value) pairs.
class TopKCodec final : public WireCodec {
 public:
  TopKCodec(double fraction, std::string name) : fraction_(fraction), name_(std::move(name)) {}
  absl::string_view name() const override { return name_; }
  DType dtype() const override { return DType::kF32; }
  bool sparse() const override { return true; }
  int64_t Count(int64_t elements) const {
    if (elements <= 0) return 0;
    const int64_t k = static_cast<int64_t>(std::ceil(fraction_ * static_cast<double>(elements)));
    return std::clamp<int64_t>(k, 1, elements);
  }
  int64_t EncodedBytes(int64_t elements) const override { return 8 * Count(elements); }
  void Encode(absl::Span<const float> in, absl::Span<float> residual,
              void* out) const override {
    const int64_t n = static_cast<int64_t>(in.size());
    const int64_t k = Count(n);
    // The values to send from: the gradient plus what earlier steps left.
    std::vector<float> x(in.begin(), in.end());
    if (!residual.empty()) {
      for (int64_t i = 0; i < n; ++i) x[i] += residual[i];
    }
    // The k largest magnitudes (ties broken by index, so the choice is a
    // function of the values), then in ascending index order.
    std::vector<uint32_t> order(n);
    for (int64_t i = 0; i < n; ++i) order[i] = static_cast<uint32_t>(i);
    auto larger = [&x](uint32_t a, uint32_t b) {
      const float fa = std::fabs(x[a]), fb = std::fabs(x[b]);
      return fa != fb ? fa > fb : a < b;
    };
    if (k < n) std::nth_element(order.begin(), order.begin() + k, order.end(), larger);
    std::sort(order.begin(), order.begin() + k);
    char* dst = static_cast<char*>(out);
    for (int64_t j = 0; j < k; ++j) {
      const uint32_t i = order[j];
      std::memcpy(dst + 8 * j, &i, 4);
      std::memcpy(dst + 8 * j + 4, &x[i], 4);
    }
    if (!residual.empty()) {
      // What was not sent stays for the next step; what was sent, nothing.
      for (int64_t i = 0; i < n; ++i) residual[i] = x[i];
      for (int64_t j = 0; j < k; ++j) residual[order[j]] = 0.f;
    }
  }
  absl::Status Decode(absl::Span<const absl::string_view> pieces,
                      absl::Span<float> out) const override {
    if (PiecesBytes(pieces) != EncodedBytes(static_cast<int64_t>(out.size()))) {
      return absl::InvalidArgumentError(absl::StrCat(
          PiecesBytes(pieces), " bytes of ", name_, " data for ", out.size(), " elements (",
          EncodedBytes(static_cast<int64_t>(out.size())), " expected)"));
    }
    return DecodeTopK(pieces, out);
  }

 private:
  const double fraction_;
  const std::string name_;
};

const Fp32Codec kFp32;
const HalfCodec kFp16(DType::kF16);
const HalfCodec kBf16(DType::kBF16);

}  // namespace

absl::StatusOr<std::unique_ptr<WireCodec>> MakeWireCodec(absl::string_view name) {
  if (name.empty() || name == "none") return std::unique_ptr<WireCodec>(new Fp32Codec());
  if (name == "fp16") return std::unique_ptr<WireCodec>(new HalfCodec(DType::kF16));
  if (name == "bf16") return std::unique_ptr<WireCodec>(new HalfCodec(DType::kBF16));
  if (absl::ConsumePrefix(&name, "topk:")) {
    double fraction = 0;
    if (!absl::SimpleAtod(name, &fraction) || !(fraction > 0) || fraction > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "topk:", name, ": the fraction sent must be a number in (0, 1], e.g. topk:0.01"));
    }
    return std::unique_ptr<WireCodec>(new TopKCodec(fraction, absl::StrCat("topk:", name)));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown compression '", name, "'; known: none, fp16, bf16, topk:F"));
}

namespace {

// DecodeTopK and ApplyDelta: the pairs checked whole, then written; the
// elements not listed zeroed (`zero_rest`) or left alone.
absl::Status DecodePairs(absl::Span<const absl::string_view> pieces, absl::Span<float> out,
                         bool zero_rest) {
  const int64_t bytes = PiecesBytes(pieces);
  if (bytes % 8 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a top-k chunk of ", bytes, " bytes: not whole (index, value) pairs"));
  }
  const int64_t pairs = bytes / 8;
  if (pairs > static_cast<int64_t>(out.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a top-k chunk of ", pairs, " pairs for a chunk of ", out.size(), " elements"));
  }
  // Checked whole before anything is written.
  std::vector<uint32_t> index(pairs);
  std::vector<float> value(pairs);
  ForEachElement(pieces, 8, [&](int64_t j, const char* p) {
    std::memcpy(&index[j], p, 4);
    std::memcpy(&value[j], p + 4, 4);
  });
  for (int64_t j = 0; j < pairs; ++j) {
    if (index[j] >= out.size()) {
      return absl::InvalidArgumentError(absl::StrCat("top-k pair ", j, " has index ", index[j],
                                                     ", out of range for a chunk of ",
                                                     out.size(), " elements"));
    }
    if (j > 0 && index[j] <= index[j - 1]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "top-k pair ", j, " has index ", index[j], " after ", index[j - 1],
          ": indices must be strictly ascending"));
    }
    if (!std::isfinite(value[j])) {
      return absl::InvalidArgumentError(
          absl::StrCat("top-k pair ", j, " (index ", index[j], ") is not finite"));
    }
  }
  if (zero_rest) std::fill(out.begin(), out.end(), 0.f);
  for (int64_t j = 0; j < pairs; ++j) out[index[j]] = value[j];
  return absl::OkStatus();
}

bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

}  // namespace

absl::Status DecodeTopK(absl::Span<const absl::string_view> pieces, absl::Span<float> out) {
  return DecodePairs(pieces, out, /*zero_rest=*/true);
}

absl::Status ApplyDelta(absl::Span<const absl::string_view> pieces, absl::Span<float> out) {
  return DecodePairs(pieces, out, /*zero_rest=*/false);
}

int64_t CountChanged(absl::Span<const float> now, absl::Span<const float> before, int64_t limit) {
  int64_t changed = 0;
  for (size_t i = 0; i < now.size() && changed < limit; ++i) {
    changed += SameBits(now[i], before[i]) ? 0 : 1;
  }
  return changed;
}

void EncodeChanged(absl::Span<const float> now, absl::Span<const float> before, void* out) {
  char* p = static_cast<char*>(out);
  for (size_t i = 0; i < now.size(); ++i) {
    if (SameBits(now[i], before[i])) continue;
    const uint32_t index = static_cast<uint32_t>(i);
    std::memcpy(p, &index, 4);
    std::memcpy(p + 4, &now[i], 4);
    p += 8;
  }
}

absl::StatusOr<const WireCodec*> WireCodecForDType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return &kFp32;
    case DType::kF16:
      return &kFp16;
    case DType::kBF16:
      return &kBf16;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("no wire codec sends ", DTypeName(dtype), " data"));
  }
}

}  // namespace ps
