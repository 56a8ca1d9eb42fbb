#include "common/wire_codec.h"

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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
  void Encode(absl::Span<const float> in, void* out) const override {
    std::memcpy(out, in.data(), in.size() * sizeof(float));
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
  void Encode(absl::Span<const float> in, void* out) const override {
    // Element by element into possibly unaligned bytes.
    char* dst = static_cast<char*>(out);
    for (size_t i = 0; i < in.size(); ++i) {
      const uint16_t bits =
          dtype_ == DType::kF16 ? FloatToHalf(in[i]) : FloatToBfloat16(in[i]);
      std::memcpy(dst + 2 * i, &bits, 2);
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

const Fp32Codec kFp32;
const HalfCodec kFp16(DType::kF16);
const HalfCodec kBf16(DType::kBF16);

}  // namespace

absl::StatusOr<std::unique_ptr<WireCodec>> MakeWireCodec(absl::string_view name) {
  if (name.empty() || name == "none") return std::unique_ptr<WireCodec>(new Fp32Codec());
  if (name == "fp16") return std::unique_ptr<WireCodec>(new HalfCodec(DType::kF16));
  if (name == "bf16") return std::unique_ptr<WireCodec>(new HalfCodec(DType::kBF16));
  return absl::InvalidArgumentError(
      absl::StrCat("unknown compression '", name, "'; known: none, fp16, bf16"));
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
