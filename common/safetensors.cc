#include "common/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/half.h"
#include "common/status_macros.h"

namespace ps {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors.cc copies little-endian file bytes as host values");

namespace {

// Deeper than any tensor framework goes; bounds what a hostile shape array
// can make the parser allocate.
constexpr size_t kMaxRank = 64;

// ---------------------------------------------------------------------------
// Dtypes: one table says everything the code needs to know about each.

template <typename T>
T Load(const uint8_t* bytes) {
  T v;
  std::memcpy(&v, bytes, sizeof(T));
  return v;
}

// `n` elements of `bytes` into `out`. The integer converters return how many
// they converted: n, or the index of the first value int64 cannot hold.
template <typename T>
int64_t IntegersToInt64s(const uint8_t* bytes, int64_t n, int64_t* out) {
  for (int64_t i = 0; i < n; ++i) {
    const T v = Load<T>(bytes + i * sizeof(T));
    if constexpr (std::is_same_v<T, uint64_t>) {
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return i;
    }
    out[i] = static_cast<int64_t>(v);
  }
  return n;
}

int64_t BoolsToInt64s(const uint8_t* bytes, int64_t n, int64_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = bytes[i] != 0 ? 1 : 0;
  return n;
}

template <typename T, float (*kToFloat)(T)>
void FloatingToFloats(const uint8_t* bytes, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = kToFloat(Load<T>(bytes + i * sizeof(T)));
}

float Identity(float v) { return v; }
float Narrow(double v) { return static_cast<float>(v); }

struct DTypeInfo {
  SafetensorsDType dtype;
  absl::string_view name;  // the file's spelling
  int64_t size;            // bytes per element
  std::optional<DType> ps_dtype;
  // Integer and BOOL elements as int64 (ToInt64s, and ToFloats through it);
  // null for floating-point types.
  int64_t (*to_int64s)(const uint8_t* bytes, int64_t n, int64_t* out);
  // Floating-point elements as float; null for the others (and the F8 types,
  // which have no conversion yet).
  void (*to_floats)(const uint8_t* bytes, int64_t n, float* out);
};

constexpr DTypeInfo kDTypes[] = {
    {SafetensorsDType::kBool, "BOOL", 1, std::nullopt, &BoolsToInt64s, nullptr},
    {SafetensorsDType::kU8, "U8", 1, std::nullopt, &IntegersToInt64s<uint8_t>, nullptr},
    {SafetensorsDType::kI8, "I8", 1, std::nullopt, &IntegersToInt64s<int8_t>, nullptr},
    {SafetensorsDType::kF8E5M2, "F8_E5M2", 1, std::nullopt, nullptr, nullptr},
    {SafetensorsDType::kF8E4M3, "F8_E4M3", 1, std::nullopt, nullptr, nullptr},
    {SafetensorsDType::kI16, "I16", 2, std::nullopt, &IntegersToInt64s<int16_t>, nullptr},
    {SafetensorsDType::kU16, "U16", 2, std::nullopt, &IntegersToInt64s<uint16_t>, nullptr},
    {SafetensorsDType::kF16, "F16", 2, DType::kF16, nullptr,
     &FloatingToFloats<uint16_t, HalfToFloat>},
    {SafetensorsDType::kBF16, "BF16", 2, DType::kBF16, nullptr,
     &FloatingToFloats<uint16_t, Bfloat16ToFloat>},
    {SafetensorsDType::kI32, "I32", 4, DType::kI32, &IntegersToInt64s<int32_t>, nullptr},
    {SafetensorsDType::kU32, "U32", 4, std::nullopt, &IntegersToInt64s<uint32_t>, nullptr},
    {SafetensorsDType::kF32, "F32", 4, DType::kF32, nullptr, &FloatingToFloats<float, Identity>},
    {SafetensorsDType::kF64, "F64", 8, std::nullopt, nullptr, &FloatingToFloats<double, Narrow>},
    {SafetensorsDType::kI64, "I64", 8, DType::kI64, &IntegersToInt64s<int64_t>, nullptr},
    {SafetensorsDType::kU64, "U64", 8, std::nullopt, &IntegersToInt64s<uint64_t>, nullptr},
};

const DTypeInfo* FindDType(SafetensorsDType dtype) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.dtype == dtype) return &info;
  }
  return nullptr;
}

// prod(shape) into *out; false if a dimension is negative or it overflows.
bool CheckedNumElements(const Shape& shape, int64_t* out) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return false;
  }
  *out = n;
  return true;
}

// prod(shape) * element size into *out; false on negative dims or overflow.
bool CheckedNumBytes(const Shape& shape, SafetensorsDType dtype, int64_t* out) {
  int64_t n;
  return CheckedNumElements(shape, &n) &&
         !__builtin_mul_overflow(n, SafetensorsDTypeSize(dtype), out);
}

std::string ShapeString(const Shape& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// ---------------------------------------------------------------------------
// UTF-8 and JSON strings.

// Length of the valid UTF-8 sequence starting at s[i] (1..4), or 0 if it is
// invalid: truncated, overlong, a surrogate, or above U+10FFFF.
size_t Utf8SequenceLength(absl::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t b0 = byte(i);
  if (b0 < 0x80) return 1;
  size_t len;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    if (b0 == 0xE0) lo = 0xA0;  // overlong
    if (b0 == 0xED) hi = 0x9F;  // surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    if (b0 == 0xF0) lo = 0x90;  // overlong
    if (b0 == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return 0;
  }
  if (s.size() - i < len) return 0;
  if (byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (size_t k = 2; k < len; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
  }
  return len;
}

bool IsValidUtf8(absl::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t len = Utf8SequenceLength(s, i);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Appends `s` (valid UTF-8) as a JSON string literal, escaping what JSON
// requires and passing other characters through.
void AppendJsonString(absl::string_view s, std::string* out) {
  out->push_back('"');
  for (char c : s) {
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\b':
        out->append("\\b");
        break;
      case '\f':
        out->append("\\f");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      default:
        if (static_cast<uint8_t>(c) < 0x20) {
          static constexpr char kHex[] = "0123456789abcdef";
          out->append("\\u00");
          out->push_back(kHex[static_cast<uint8_t>(c) >> 4]);
          out->push_back(kHex[c & 0xF]);
        } else {
          out->push_back(c);
        }
    }
  }
  out->push_back('"');
}

// ---------------------------------------------------------------------------
// The header parser: a strict recursive-descent parser for exactly the JSON
// a safetensors header may hold. It builds no generic tree, so its memory is a
// small multiple of the header's length.

struct TensorEntry {
  std::string name;
  SafetensorsDType dtype;
  Shape shape;
  int64_t begin;
  int64_t end;
};

struct ParsedHeader {
  std::vector<TensorEntry> tensors;  // in header order
  std::map<std::string, std::string> metadata;
};

class HeaderParser {
 public:
  HeaderParser(absl::string_view path, absl::string_view text) : path_(path), text_(text) {}

  absl::StatusOr<ParsedHeader> Parse() {
    ParsedHeader header;
    // The format requires the header to open with '{' (no leading space).
    if (text_.empty() || text_[0] != '{') return Error("the header must start with '{'");
    ++pos_;
    std::set<std::string> names;
    bool seen_metadata = false;
    SkipSpace();
    if (!Consume('}')) {
      while (true) {
        SkipSpace();
        const size_t key_pos = pos_;
        std::string key;
        PS_RETURN_IF_ERROR(ParseString(&key));
        PS_RETURN_IF_ERROR(ExpectAfterSpace(':', "after a key"));
        SkipSpace();
        if (key == "__metadata__") {
          if (seen_metadata) return ErrorAt(key_pos, "duplicate \"__metadata__\"");
          seen_metadata = true;
          PS_RETURN_IF_ERROR(ParseMetadata(&header.metadata));
        } else {
          if (!names.insert(key).second) {
            return ErrorAt(key_pos, absl::StrCat("duplicate tensor name '", key, "'"));
          }
          TensorEntry entry;
          entry.name = std::move(key);
          PS_RETURN_IF_ERROR(ParseTensorInfo(&entry));
          header.tensors.push_back(std::move(entry));
        }
        SkipSpace();
        if (Consume('}')) break;
        if (!Consume(',')) return Error("expected ',' or '}' after a member of the header");
      }
    }
    SkipSpace();
    if (pos_ != text_.size()) return Error("unexpected characters after the header's object");
    return header;
  }

 private:
  absl::Status ErrorAt(size_t pos, absl::string_view problem) const {
    return absl::InvalidArgumentError(absl::StrCat(
        path_, ": malformed safetensors header at header byte ", pos, ": ", problem));
  }
  absl::Status Error(absl::string_view problem) const { return ErrorAt(pos_, problem); }

  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek() const { return text_[pos_]; }

  void SkipSpace() {
    while (!AtEnd() && (Peek() == ' ' || Peek() == '\t' || Peek() == '\n' || Peek() == '\r')) {
      ++pos_;
    }
  }

  bool Consume(char c) {
    if (AtEnd() || Peek() != c) return false;
    ++pos_;
    return true;
  }

  absl::Status ExpectAfterSpace(char c, absl::string_view where) {
    SkipSpace();
    if (Consume(c)) return absl::OkStatus();
    return Error(absl::StrCat("expected '", std::string(1, c), "' ", where,
                              AtEnd() ? " but the header ended" : ""));
  }

  absl::Status ParseHex4(uint32_t* out) {
    if (text_.size() - pos_ < 4) return Error("truncated \\u escape");
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = text_[pos_ + k];
      v <<= 4;
      if (c >= '0' && c <= '9') {
        v |= c - '0';
      } else if (c >= 'a' && c <= 'f') {
        v |= c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        v |= c - 'A' + 10;
      } else {
        return ErrorAt(pos_ + k, "bad hex digit in \\u escape");
      }
    }
    pos_ += 4;
    *out = v;
    return absl::OkStatus();
  }

  absl::Status ParseString(std::string* out) {
    if (!Consume('"')) return Error("expected a string");
    while (true) {
      if (AtEnd()) return Error("unterminated string");
      const char c = Peek();
      if (c == '"') {
        ++pos_;
        return absl::OkStatus();
      }
      if (static_cast<uint8_t>(c) < 0x20) return Error("control character in a string");
      if (c != '\\') {
        const size_t len = Utf8SequenceLength(text_, pos_);
        if (len == 0) return Error("invalid UTF-8 in a string");
        out->append(text_.data() + pos_, len);
        pos_ += len;
        continue;
      }
      ++pos_;
      if (AtEnd()) return Error("unterminated escape");
      const char e = Peek();
      ++pos_;
      switch (e) {
        case '"':
          out->push_back('"');
          break;
        case '\\':
          out->push_back('\\');
          break;
        case '/':
          out->push_back('/');
          break;
        case 'b':
          out->push_back('\b');
          break;
        case 'f':
          out->push_back('\f');
          break;
        case 'n':
          out->push_back('\n');
          break;
        case 'r':
          out->push_back('\r');
          break;
        case 't':
          out->push_back('\t');
          break;
        case 'u': {
          uint32_t cp = 0;
          PS_RETURN_IF_ERROR(ParseHex4(&cp));
          if (cp >= 0xDC00 && cp <= 0xDFFF) return Error("unpaired low surrogate in \\u escape");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (!(Consume('\\') && Consume('u'))) {
              return Error("high surrogate not followed by a \\u low surrogate");
            }
            uint32_t low = 0;
            PS_RETURN_IF_ERROR(ParseHex4(&low));
            if (low < 0xDC00 || low > 0xDFFF) return Error("high surrogate without a low one");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          AppendUtf8(cp, out);
          break;
        }
        default:
          return ErrorAt(pos_ - 2, absl::StrCat("invalid escape '\\", std::string(1, e), "'"));
      }
    }
  }

  // A JSON integer that fits int64_t (no fraction or exponent).
  absl::Status ParseInt(int64_t* out) {
    const size_t start = pos_;
    const bool negative = Consume('-');
    if (AtEnd() || Peek() < '0' || Peek() > '9') return ErrorAt(start, "expected an integer");
    if (Peek() == '0' && pos_ + 1 < text_.size() && text_[pos_ + 1] >= '0' &&
        text_[pos_ + 1] <= '9') {
      return ErrorAt(start, "integer with a leading zero");
    }
    // Accumulate negatively so that INT64_MIN parses too.
    int64_t v = 0;
    while (!AtEnd() && Peek() >= '0' && Peek() <= '9') {
      if (__builtin_mul_overflow(v, 10, &v) || __builtin_sub_overflow(v, Peek() - '0', &v)) {
        return ErrorAt(start, "integer out of the 64-bit range");
      }
      ++pos_;
    }
    if (!AtEnd() && (Peek() == '.' || Peek() == 'e' || Peek() == 'E')) {
      return ErrorAt(start, "expected an integer, found a fraction or exponent");
    }
    if (!negative) {
      if (v == std::numeric_limits<int64_t>::min()) {
        return ErrorAt(start, "integer out of the 64-bit range");
      }
      v = -v;
    }
    *out = v;
    return absl::OkStatus();
  }

  // '[' int, ... ']' with at most `max_count` elements.
  absl::Status ParseIntArray(size_t max_count, absl::string_view what, std::vector<int64_t>* out) {
    if (!Consume('[')) return Error(absl::StrCat("expected an array for ", what));
    SkipSpace();
    if (Consume(']')) return absl::OkStatus();
    while (true) {
      SkipSpace();
      if (out->size() == max_count) {
        return Error(absl::StrCat(what, " has more than ", max_count, " elements"));
      }
      const size_t int_pos = pos_;
      int64_t v;
      PS_RETURN_IF_ERROR(ParseInt(&v));
      if (v < 0) return ErrorAt(int_pos, absl::StrCat("negative value in ", what));
      out->push_back(v);
      SkipSpace();
      if (Consume(']')) return absl::OkStatus();
      if (!Consume(',')) return Error(absl::StrCat("expected ',' or ']' in ", what));
    }
  }

  // {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, all three
  // required, nothing else allowed.
  absl::Status ParseTensorInfo(TensorEntry* entry) {
    const std::string where = absl::StrCat("tensor '", entry->name, "'");
    if (!Consume('{')) return Error(absl::StrCat("expected an object for ", where));
    bool has_dtype = false, has_shape = false, has_offsets = false;
    SkipSpace();
    if (!Consume('}')) {
      while (true) {
        SkipSpace();
        const size_t key_pos = pos_;
        std::string key;
        PS_RETURN_IF_ERROR(ParseString(&key));
        PS_RETURN_IF_ERROR(ExpectAfterSpace(':', "after a key"));
        SkipSpace();
        bool* seen;
        if (key == "dtype") {
          seen = &has_dtype;
        } else if (key == "shape") {
          seen = &has_shape;
        } else if (key == "data_offsets") {
          seen = &has_offsets;
        } else {
          return ErrorAt(key_pos, absl::StrCat("unknown field '", key, "' in ", where));
        }
        if (*seen) return ErrorAt(key_pos, absl::StrCat("duplicate field '", key, "' in ", where));
        *seen = true;
        if (key == "dtype") {
          const size_t value_pos = pos_;
          std::string name;
          PS_RETURN_IF_ERROR(ParseString(&name));
          absl::StatusOr<SafetensorsDType> dtype = SafetensorsDTypeFromName(name);
          if (!dtype.ok()) {
            return absl::InvalidArgumentError(absl::StrCat(path_, ": ", where, " at header byte ",
                                                           value_pos, ": unknown dtype '", name,
                                                           "'"));
          }
          entry->dtype = *dtype;
        } else if (key == "shape") {
          PS_RETURN_IF_ERROR(ParseIntArray(kMaxRank, absl::StrCat("the shape of ", where),
                                           &entry->shape));
        } else {
          const size_t value_pos = pos_;
          std::vector<int64_t> offsets;
          PS_RETURN_IF_ERROR(
              ParseIntArray(2, absl::StrCat("the data_offsets of ", where), &offsets));
          if (offsets.size() != 2) {
            return ErrorAt(value_pos,
                           absl::StrCat("data_offsets of ", where, " must be [begin, end]"));
          }
          entry->begin = offsets[0];
          entry->end = offsets[1];
        }
        SkipSpace();
        if (Consume('}')) break;
        if (!Consume(',')) return Error(absl::StrCat("expected ',' or '}' in ", where));
      }
    }
    if (!has_dtype || !has_shape || !has_offsets) {
      return Error(absl::StrCat(where, " lacks ",
                                !has_dtype ? "\"dtype\"" : !has_shape ? "\"shape\"" : "\"data_offsets\""));
    }
    return absl::OkStatus();
  }

  // {"key": "value", ...}: strings only.
  absl::Status ParseMetadata(std::map<std::string, std::string>* metadata) {
    if (!Consume('{')) return Error("expected an object for \"__metadata__\"");
    SkipSpace();
    if (Consume('}')) return absl::OkStatus();
    while (true) {
      SkipSpace();
      const size_t key_pos = pos_;
      std::string key, value;
      PS_RETURN_IF_ERROR(ParseString(&key));
      PS_RETURN_IF_ERROR(ExpectAfterSpace(':', "after a key"));
      SkipSpace();
      if (AtEnd() || Peek() != '"') return Error("\"__metadata__\" values must be strings");
      PS_RETURN_IF_ERROR(ParseString(&value));
      if (!metadata->emplace(std::move(key), std::move(value)).second) {
        return ErrorAt(key_pos, "duplicate key in \"__metadata__\"");
      }
      SkipSpace();
      if (Consume('}')) return absl::OkStatus();
      if (!Consume(',')) return Error("expected ',' or '}' in \"__metadata__\"");
    }
  }

  absl::string_view path_;
  absl::string_view text_;
  size_t pos_ = 0;
};

// ---------------------------------------------------------------------------
// Files.

absl::Status ErrnoError(int error, absl::string_view path, absl::string_view what) {
  return absl::ErrnoToStatus(error, absl::StrCat(path, ": ", what));
}

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

// Reads exactly `size` bytes; kDataLoss if the file ends first.
absl::Status ReadExactly(std::FILE* f, void* out, size_t size, absl::string_view path,
                         absl::string_view what) {
  if (size == 0) return absl::OkStatus();
  if (std::fread(out, 1, size, f) == size) return absl::OkStatus();
  if (std::ferror(f)) return ErrnoError(errno, path, absl::StrCat("reading ", what));
  return absl::DataLossError(absl::StrCat(path, ": file ended while reading ", what));
}

absl::Status WriteAll(int fd, const void* data, size_t size, absl::string_view path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, path, "write");
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

// ---------------------------------------------------------------------------
// Dtypes.

int64_t SafetensorsDTypeSize(SafetensorsDType dtype) {
  const DTypeInfo* info = FindDType(dtype);
  return info == nullptr ? 0 : info->size;
}

absl::string_view SafetensorsDTypeName(SafetensorsDType dtype) {
  const DTypeInfo* info = FindDType(dtype);
  return info == nullptr ? "UNKNOWN" : info->name;
}

absl::StatusOr<SafetensorsDType> SafetensorsDTypeFromName(absl::string_view name) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.name == name) return info.dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown safetensors dtype '", name, "'"));
}

SafetensorsDType ToSafetensorsDType(DType dtype) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.ps_dtype == dtype) return info.dtype;
  }
  return SafetensorsDType::kF32;  // not reached: the table names every DType
}

absl::StatusOr<DType> ToDType(SafetensorsDType dtype) {
  const DTypeInfo* info = FindDType(dtype);
  if (info == nullptr || !info->ps_dtype.has_value()) {
    return absl::UnimplementedError(
        absl::StrCat("no ps::DType for safetensors dtype ", SafetensorsDTypeName(dtype)));
  }
  return *info->ps_dtype;
}

// ---------------------------------------------------------------------------
// NamedHostTensor.

absl::StatusOr<NamedHostTensor> NamedHostTensor::FromFloats(std::string name, Shape shape,
                                                            absl::Span<const float> values) {
  int64_t n;
  if (!CheckedNumElements(shape, &n) || static_cast<uint64_t>(n) != values.size()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': shape ",
                                                   ShapeString(shape), " does not hold ",
                                                   values.size(), " values"));
  }
  NamedHostTensor t;
  t.name = std::move(name);
  t.dtype = SafetensorsDType::kF32;
  t.shape = std::move(shape);
  t.data.resize(values.size() * sizeof(float));
  if (!values.empty()) std::memcpy(t.data.data(), values.data(), t.data.size());
  return t;
}

absl::StatusOr<NamedHostTensor> NamedHostTensor::FromInt64s(std::string name, Shape shape,
                                                            absl::Span<const int64_t> values) {
  int64_t n;
  if (!CheckedNumElements(shape, &n) || static_cast<uint64_t>(n) != values.size()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': shape ",
                                                   ShapeString(shape), " does not hold ",
                                                   values.size(), " values"));
  }
  NamedHostTensor t;
  t.name = std::move(name);
  t.dtype = SafetensorsDType::kI64;
  t.shape = std::move(shape);
  t.data.resize(values.size() * sizeof(int64_t));
  if (!values.empty()) std::memcpy(t.data.data(), values.data(), t.data.size());
  return t;
}

int64_t NamedHostTensor::num_elements() const {
  int64_t n = 0;
  return CheckedNumElements(shape, &n) ? n : 0;
}

absl::StatusOr<std::vector<float>> NamedHostTensor::ToFloats() const {
  int64_t bytes;
  const DTypeInfo* info = FindDType(dtype);
  if (info == nullptr || !CheckedNumBytes(shape, dtype, &bytes) ||
      static_cast<uint64_t>(bytes) != data.size()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': ", data.size(),
                                                   " bytes do not hold shape ", ShapeString(shape),
                                                   " of ", SafetensorsDTypeName(dtype)));
  }
  if (info->to_floats == nullptr && info->to_int64s == nullptr) {
    return absl::UnimplementedError(
        absl::StrCat("tensor '", name, "': no float conversion for ", SafetensorsDTypeName(dtype)));
  }
  const int64_t n = bytes / info->size;
  std::vector<float> out(n);
  if (info->to_floats != nullptr) {
    info->to_floats(data.data(), n, out.data());
  } else {
    // Integers and BOOL go through int64, which refuses U64 values above
    // INT64_MAX.
    PS_ASSIGN_OR_RETURN(std::vector<int64_t> ints, ToInt64s());
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(ints[i]);
  }
  return out;
}

absl::StatusOr<std::vector<int64_t>> NamedHostTensor::ToInt64s() const {
  int64_t bytes;
  const DTypeInfo* info = FindDType(dtype);
  if (info == nullptr || !CheckedNumBytes(shape, dtype, &bytes) ||
      static_cast<uint64_t>(bytes) != data.size()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': ", data.size(),
                                                   " bytes do not hold shape ", ShapeString(shape),
                                                   " of ", SafetensorsDTypeName(dtype)));
  }
  if (info->to_int64s == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", name, "': ", SafetensorsDTypeName(dtype), " is not an integer dtype"));
  }
  const int64_t n = bytes / info->size;
  std::vector<int64_t> out(n);
  const int64_t converted = info->to_int64s(data.data(), n, out.data());
  if (converted < n) {  // only U64 has values int64 cannot hold
    return absl::OutOfRangeError(absl::StrCat("tensor '", name, "': ", info->name, " value ",
                                              Load<uint64_t>(data.data() + converted * 8),
                                              " does not fit int64"));
  }
  return out;
}

absl::StatusOr<const NamedHostTensor*> SafetensorsFile::Find(absl::string_view name) const {
  for (const NamedHostTensor& t : tensors) {
    if (t.name == name) return &t;
  }
  return absl::NotFoundError(absl::StrCat("no tensor named '", name, "'"));
}

// ---------------------------------------------------------------------------
// Writing.

absl::Status WriteSafetensors(const std::string& path, absl::Span<const NamedHostTensor> tensors,
                              const std::map<std::string, std::string>& metadata) {
  // 1. Validate everything before touching the file system.
  std::set<absl::string_view> names;
  for (const NamedHostTensor& t : tensors) {
    if (FindDType(t.dtype) == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor '", t.name, "' has an invalid dtype"));
    }
    if (t.name == "__metadata__") {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": \"__metadata__\" is reserved, not a tensor name"));
    }
    if (!IsValidUtf8(t.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor name '", t.name, "' is not valid UTF-8"));
    }
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": duplicate tensor name '", t.name, "'"));
    }
    int64_t bytes;
    if (!CheckedNumBytes(t.shape, t.dtype, &bytes) ||
        static_cast<uint64_t>(bytes) != t.data.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tensor '", t.name, "' has ", t.data.size(), " bytes, which do not hold shape ",
          ShapeString(t.shape), " of ", SafetensorsDTypeName(t.dtype)));
    }
  }
  for (const auto& [key, value] : metadata) {
    if (!IsValidUtf8(key) || !IsValidUtf8(value)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": metadata entry '", key, "' is not valid UTF-8"));
    }
  }

  // 2. The reference implementation's order: dtype descending, then name.
  std::vector<const NamedHostTensor*> order;
  order.reserve(tensors.size());
  for (const NamedHostTensor& t : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const NamedHostTensor* a, const NamedHostTensor* b) {
    if (a->dtype != b->dtype) return a->dtype > b->dtype;
    return a->name < b->name;
  });

  // 3. The header, compact as serde_json writes it, padded to 8 bytes.
  std::string header = "{";
  bool first = true;
  if (!metadata.empty()) {
    header.append("\"__metadata__\":{");
    for (const auto& [key, value] : metadata) {
      if (!first) header.push_back(',');
      first = false;
      AppendJsonString(key, &header);
      header.push_back(':');
      AppendJsonString(value, &header);
    }
    header.push_back('}');
    first = false;
  }
  uint64_t offset = 0;
  for (const NamedHostTensor* t : order) {
    if (!first) header.push_back(',');
    first = false;
    AppendJsonString(t->name, &header);
    absl::StrAppend(&header, ":{\"dtype\":\"", SafetensorsDTypeName(t->dtype), "\",\"shape\":[",
                    absl::StrJoin(t->shape, ","), "],\"data_offsets\":[", offset, ",",
                    offset + t->data.size(), "]}");
    offset += t->data.size();
  }
  header.push_back('}');
  header.append((8 - header.size() % 8) % 8, ' ');
  uint8_t length[8];
  const uint64_t header_size = header.size();
  std::memcpy(length, &header_size, 8);

  // 4. Write the temporary file, make it durable, rename it into place.
  const std::string tmp_path = path + ".tmp";
  const int fd = ::open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError(errno, tmp_path, "cannot create");
  absl::Status status = WriteAll(fd, length, 8, tmp_path);
  if (status.ok()) status = WriteAll(fd, header.data(), header.size(), tmp_path);
  for (const NamedHostTensor* t : order) {
    if (!status.ok()) break;
    status = WriteAll(fd, t->data.data(), t->data.size(), tmp_path);
  }
  if (status.ok() && ::fsync(fd) != 0) status = ErrnoError(errno, tmp_path, "fsync");
  if (::close(fd) != 0 && status.ok()) status = ErrnoError(errno, tmp_path, "close");
  if (status.ok() && std::rename(tmp_path.c_str(), path.c_str()) != 0) {
    status = ErrnoError(errno, path, absl::StrCat("cannot rename ", tmp_path, " to it"));
  }
  if (!status.ok()) {
    ::unlink(tmp_path.c_str());
    return status;
  }
  // Make the rename itself durable; the data is already safe, so a directory
  // that cannot be opened or synced is not an error.
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Reading.

absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path) {
  // 1. Open and size the file.
  FilePtr file(std::fopen(path.c_str(), "rb"));
  if (file == nullptr) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return ErrnoError(errno, path, "cannot open");
  }
  struct stat st;
  if (::fstat(::fileno(file.get()), &st) != 0) return ErrnoError(errno, path, "fstat");
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);

  // 2. The header length, checked against the limit and the file's size
  //    before anything is allocated from it.
  if (file_size < 8) {
    return absl::DataLossError(absl::StrCat(path, ": ", file_size,
                                            " bytes is too short for a safetensors file "
                                            "(it starts with an 8-byte header length)"));
  }
  uint8_t length_bytes[8];
  PS_RETURN_IF_ERROR(ReadExactly(file.get(), length_bytes, 8, path, "the header length"));
  uint64_t header_size;
  std::memcpy(&header_size, length_bytes, 8);
  if (header_size > kMaxSafetensorsHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": header length ", header_size, " exceeds the limit of ",
                     kMaxSafetensorsHeaderBytes, " bytes (corrupt or not a safetensors file)"));
  }
  if (header_size > file_size - 8) {
    return absl::DataLossError(absl::StrCat(path, ": header length ", header_size,
                                            " exceeds the ", file_size - 8,
                                            " bytes that follow it (truncated file?)"));
  }
  std::string header_text(header_size, '\0');
  PS_RETURN_IF_ERROR(ReadExactly(file.get(), header_text.data(), header_size, path, "the header"));

  // 3. Parse and check the header.
  PS_ASSIGN_OR_RETURN(ParsedHeader header, HeaderParser(path, header_text).Parse());
  std::vector<TensorEntry>& entries = header.tensors;
  const uint64_t buffer_size = file_size - 8 - header_size;
  for (const TensorEntry& e : entries) {
    int64_t bytes;
    if (!CheckedNumBytes(e.shape, e.dtype, &bytes)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", e.name, "' has shape ",
                                                     ShapeString(e.shape),
                                                     ", too large for 64-bit sizes"));
    }
    if (e.end < e.begin || e.end - e.begin != bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tensor '", e.name, "': shape ", ShapeString(e.shape), " of ",
          SafetensorsDTypeName(e.dtype), " needs ", bytes, " bytes but data_offsets [", e.begin,
          ", ", e.end, "] ", e.end < e.begin ? "are reversed" : absl::StrCat("hold ", e.end - e.begin)));
    }
    if (static_cast<uint64_t>(e.end) > buffer_size) {
      return absl::DataLossError(absl::StrCat(path, ": tensor '", e.name, "': data_offsets [",
                                              e.begin, ", ", e.end, "] lie beyond the ",
                                              buffer_size, " bytes of data in the file (truncated?)"));
    }
  }
  // The tensors must tile the data buffer: sorted by offsets, each begins
  // where the previous ended (no overlaps, no gaps).
  std::stable_sort(entries.begin(), entries.end(), [](const TensorEntry& a, const TensorEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  int64_t expected = 0;
  const TensorEntry* previous = nullptr;
  for (const TensorEntry& e : entries) {
    if (e.begin < expected) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", e.name,
                                                     "' (data_offsets [", e.begin, ", ", e.end,
                                                     "]) overlaps tensor '", previous->name, "'"));
    }
    if (e.begin > expected) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": gap of ", e.begin - expected,
                                                     " bytes in the data before tensor '", e.name,
                                                     "' (data_offsets [", e.begin, ", ", e.end,
                                                     "])"));
    }
    expected = e.end;
    previous = &e;
  }
  if (static_cast<uint64_t>(expected) < buffer_size) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", buffer_size - expected,
                                                   " unexpected bytes after the last tensor"));
  }

  // 4. Read the data, now known to fit the file.
  SafetensorsFile result;
  result.metadata = std::move(header.metadata);
  result.tensors.reserve(entries.size());
  for (TensorEntry& e : entries) {
    NamedHostTensor t;
    t.name = std::move(e.name);
    t.dtype = e.dtype;
    t.shape = std::move(e.shape);
    t.data.resize(static_cast<size_t>(e.end - e.begin));
    PS_RETURN_IF_ERROR(ReadExactly(file.get(), t.data.data(), t.data.size(), path,
                                   absl::StrCat("tensor '", t.name, "'")));
    result.tensors.push_back(std::move(t));
  }
  return result;
}

}  // namespace ps
