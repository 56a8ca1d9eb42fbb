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

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/half.h"
#include "common/regular_file.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

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
// The header as JSON, through nlohmann-json.

// Whether `s` is valid UTF-8 (no overlong forms, surrogates or code points
// above U+10FFFF), asked of the serializer that writes the header: its dump()
// refuses anything else.
bool IsValidUtf8(const std::string& s) {
  try {
    nlohmann::json(s).dump();
    return true;
  } catch (const nlohmann::json::type_error&) {
    return false;
  }
}

// The header, compact as serde_json writes it: "__metadata__" first (if
// non-empty), then the tensors in `order` with their bytes laid end to end.
// ordered_json keeps the members in the order they are added. They are
// appended to its vector directly: its operator[] searches for the key
// first, which is quadratic in the number of tensors, and the caller has
// checked that the names are unique. Every string must be valid UTF-8.
std::string HeaderJson(const std::map<std::string, std::string>& metadata,
                       const std::vector<const NamedHostTensor*>& order) {
  using Json = nlohmann::ordered_json;
  Json header = Json::object();
  Json::object_t& members = header.get_ref<Json::object_t&>();
  members.reserve(order.size() + 1);
  if (!metadata.empty()) members.emplace_back("__metadata__", Json(metadata));
  uint64_t offset = 0;
  for (const NamedHostTensor* t : order) {
    const uint64_t end = offset + t->data.size();
    members.emplace_back(t->name, Json{{"dtype", std::string(SafetensorsDTypeName(t->dtype))},
                                       {"shape", t->shape},
                                       {"data_offsets", {offset, end}}});
    offset = end;
  }
  return header.dump();
}

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

// Turns nlohmann's SAX events into a ParsedHeader, accepting exactly what a
// safetensors header may hold:
//
//   {"__metadata__": {"key": "string", ...},                        (optional)
//    "name": {"dtype": "F32", "shape": [d, ...], "data_offsets": [begin, end]},
//    ...}
//
// nlohmann checks the JSON (syntax, escapes, UTF-8, numbers); this checks
// the schema. Every event is checked against the one place in the schema the
// parse is at, and the first that does not fit stops the parse (returns
// false), recording why. So nothing is built that the schema does not
// allow: nesting stops at three levels (a '[' or '{' anywhere else fails at
// once, so `[[[[...` costs nothing), arrays at kMaxRank elements, and
// duplicate keys fail when they are read.
//
// SAX rather than json::parse with a callback: the callback's DOM parser
// rescans the enclosing object at the end of every member object (measured:
// 40,000 tensors take 14 s instead of 30 ms), and it builds a tree the
// schema walk would then copy.
class HeaderHandler final : public nlohmann::json_sax<nlohmann::json> {
 public:
  explicit HeaderHandler(absl::string_view path) : path_(path) {}

  // The header, or why it is malformed (kInvalidArgument), once
  // nlohmann::json::sax_parse has returned.
  absl::StatusOr<ParsedHeader> Result(bool parsed) && {
    if (status_.ok() && (!parsed || expect_ != Expect::kEnd)) Fail("incomplete header");
    if (!status_.ok()) return status_;
    return std::move(header_);
  }

  bool start_object(std::size_t /*elements*/) override {
    switch (expect_) {
      case Expect::kHeader:
        expect_ = Expect::kName;
        return true;
      case Expect::kEntry:
        if (in_metadata_) {
          expect_ = Expect::kMetadataKey;
        } else {
          has_dtype_ = has_shape_ = has_offsets_ = false;
          expect_ = Expect::kField;
        }
        return true;
      default:
        return Unexpected("an object");
    }
  }

  bool key(string_t& key) override {
    switch (expect_) {
      case Expect::kName:
        in_metadata_ = key == "__metadata__";
        if (in_metadata_) {
          if (seen_metadata_) return Fail("duplicate \"__metadata__\"");
          seen_metadata_ = true;
        } else {
          if (!names_.insert(key).second) {
            return Fail(absl::StrCat("duplicate tensor name '", key, "'"));
          }
          entry_ = TensorEntry{};
          entry_.name = key;
        }
        expect_ = Expect::kEntry;
        return true;
      case Expect::kMetadataKey:
        if (header_.metadata.count(key) != 0) {
          return Fail(absl::StrCat("duplicate key in \"__metadata__\": '", key, "'"));
        }
        metadata_key_ = key;
        expect_ = Expect::kMetadataValue;
        return true;
      case Expect::kField: {
        bool* seen;
        if (key == "dtype") {
          seen = &has_dtype_;
          expect_ = Expect::kDType;
        } else if (key == "shape") {
          seen = &has_shape_;
          field_ = "shape";
          expect_ = Expect::kArray;
        } else if (key == "data_offsets") {
          seen = &has_offsets_;
          field_ = "data_offsets";
          expect_ = Expect::kArray;
        } else {
          return Fail(absl::StrCat("unknown field '", key, "' in ", Tensor()));
        }
        if (*seen) return Fail(absl::StrCat("duplicate field '", key, "' in ", Tensor()));
        *seen = true;
        return true;
      }
      default:
        return Unexpected("a key");
    }
  }

  bool end_object() override {
    switch (expect_) {
      case Expect::kName:
        expect_ = Expect::kEnd;
        return true;
      case Expect::kMetadataKey:
        expect_ = Expect::kName;
        return true;
      case Expect::kField:
        if (!has_dtype_ || !has_shape_ || !has_offsets_) {
          return Fail(absl::StrCat(Tensor(), " lacks ",
                                   !has_dtype_   ? "\"dtype\""
                                   : !has_shape_ ? "\"shape\""
                                                 : "\"data_offsets\""));
        }
        header_.tensors.push_back(std::move(entry_));
        expect_ = Expect::kName;
        return true;
      default:
        return Unexpected("the end of an object");
    }
  }

  bool start_array(std::size_t /*elements*/) override {
    if (expect_ != Expect::kArray) return Unexpected("an array");
    array_.clear();
    expect_ = Expect::kInteger;
    return true;
  }

  bool end_array() override {
    if (expect_ != Expect::kInteger) return Unexpected("the end of an array");
    if (field_ == "shape") {
      entry_.shape = std::move(array_);
    } else {
      if (array_.size() != 2) {
        return Fail(absl::StrCat("data_offsets of ", Tensor(), " must be [begin, end]"));
      }
      entry_.begin = array_[0];
      entry_.end = array_[1];
    }
    array_ = {};
    expect_ = Expect::kField;
    return true;
  }

  bool number_integer(number_integer_t value) override {
    if (expect_ != Expect::kInteger) return Unexpected("a number");
    if (value < 0) return Fail(absl::StrCat("negative value in ", Array(), ": ", value));
    return Element(value);
  }

  bool number_unsigned(number_unsigned_t value) override {
    if (expect_ != Expect::kInteger) return Unexpected("a number");
    if (value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Fail(absl::StrCat(Array(), " holds ", value, ", out of the 64-bit range"));
    }
    return Element(static_cast<int64_t>(value));
  }

  // Fractions, exponents, and integers too large for uint64 (and int64).
  bool number_float(number_float_t /*value*/, const string_t& text) override {
    if (expect_ != Expect::kInteger) return Unexpected("a number");
    if (text.find_first_of(".eE") == std::string::npos) {
      return Fail(absl::StrCat(Array(), " holds ", text, ", out of the 64-bit range"));
    }
    return Fail(absl::StrCat(Array(), " holds ", text,
                             ", which is not an integer (it has a fraction or exponent)"));
  }

  bool string(string_t& value) override {
    switch (expect_) {
      case Expect::kMetadataValue:
        header_.metadata.emplace(std::move(metadata_key_), std::move(value));
        expect_ = Expect::kMetadataKey;
        return true;
      case Expect::kDType: {
        absl::StatusOr<SafetensorsDType> dtype = SafetensorsDTypeFromName(value);
        if (!dtype.ok()) return Fail(absl::StrCat(Tensor(), ": unknown dtype '", value, "'"));
        entry_.dtype = *dtype;
        expect_ = Expect::kField;
        return true;
      }
      default:
        return Unexpected("a string");
    }
  }

  bool null() override { return Unexpected("null"); }
  bool boolean(bool /*value*/) override { return Unexpected("a boolean"); }
  bool binary(binary_t& /*value*/) override { return Unexpected("binary data"); }

  // A syntax error found by nlohmann's lexer or parser. `position` counts the
  // bytes read, so the offending byte is the one before it.
  bool parse_error(std::size_t position, const std::string& /*last_token*/,
                   const nlohmann::json::exception& error) override {
    // what() is "[json.exception.parse_error.101] parse error at line 1,
    // column 54: <problem>"; the byte offset replaces the line and column.
    absl::string_view problem = error.what();
    const size_t colon = problem.find(": ", problem.find("parse error"));
    if (colon != absl::string_view::npos) problem.remove_prefix(colon + 2);
    status_ = absl::InvalidArgumentError(
        absl::StrCat(path_, ": malformed safetensors header at header byte ",
                     position > 0 ? position - 1 : 0, ": ", problem));
    return false;
  }

 private:
  // Where the parse is in the schema: what the next event may be.
  enum class Expect {
    kHeader,         // the header's '{'
    kName,           // a tensor name or "__metadata__", or the header's '}'
    kEntry,          // the object after a name
    kMetadataKey,    // a key or '}' in "__metadata__"
    kMetadataValue,  // a string
    kField,          // "dtype", "shape" or "data_offsets", or the tensor's '}'
    kDType,          // a string
    kArray,          // the '[' of field_
    kInteger,        // an element or the ']' of field_
    kEnd,            // nothing: the header's object has closed
  };

  std::string Tensor() const { return absl::StrCat("tensor '", entry_.name, "'"); }
  std::string Array() const { return absl::StrCat("the ", field_, " of ", Tensor()); }

  bool Element(int64_t value) {
    const size_t limit = field_ == "shape" ? kMaxRank : 2;
    if (array_.size() == limit) {
      return Fail(absl::StrCat(Array(), " has more than ", limit, " elements"));
    }
    array_.push_back(value);
    return true;
  }

  // `found` where the schema has something else.
  bool Unexpected(absl::string_view found) {
    switch (expect_) {
      case Expect::kEntry:
        return Fail(absl::StrCat("expected an object for ",
                                 in_metadata_ ? "\"__metadata__\"" : Tensor(), ", found ", found));
      case Expect::kMetadataValue:
        return Fail(absl::StrCat("\"__metadata__\" values must be strings; '", metadata_key_,
                                 "' holds ", found));
      case Expect::kDType:
        return Fail(absl::StrCat("the dtype of ", Tensor(), " must be a string, found ", found));
      case Expect::kArray:
        return Fail(absl::StrCat("expected an array for ", Array(), ", found ", found));
      case Expect::kInteger:
        return Fail(absl::StrCat("expected an integer in ", Array(), ", found ", found));
      default:  // nlohmann's grammar leaves no other way to get here
        return Fail(absl::StrCat("unexpected ", found));
    }
  }

  bool Fail(absl::string_view problem) {
    status_ = absl::InvalidArgumentError(
        absl::StrCat(path_, ": malformed safetensors header: ", problem));
    return false;
  }

  absl::string_view path_;
  absl::Status status_;
  Expect expect_ = Expect::kHeader;
  ParsedHeader header_;
  std::set<std::string> names_;
  bool seen_metadata_ = false;
  bool in_metadata_ = false;  // the current name is "__metadata__"
  std::string metadata_key_;
  TensorEntry entry_;  // the tensor being read
  bool has_dtype_ = false, has_shape_ = false, has_offsets_ = false;
  absl::string_view field_;  // "shape" or "data_offsets"
  std::vector<int64_t> array_;
};

absl::StatusOr<ParsedHeader> ParseHeader(absl::string_view path, const std::string& text) {
  // The format requires the header to open with '{' (no leading space, no
  // byte-order mark, which nlohmann would skip).
  if (text.empty() || text[0] != '{') {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": malformed safetensors header at header byte 0: the header must start with '{'"));
  }
  HeaderHandler handler(path);
  bool parsed;
  try {
    parsed = nlohmann::json::sax_parse(text, &handler, nlohmann::json::input_format_t::json,
                                       /*strict=*/true, /*ignore_comments=*/false);
  } catch (const nlohmann::json::exception& e) {
    // Errors in the input reach the handler; this only keeps anything else
    // nlohmann might throw from leaving ReadSafetensors.
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": malformed safetensors header: ", e.what()));
  }
  return std::move(handler).Result(parsed);
}

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

namespace {

// A tensor of `dtype` holding `values` (their bytes copied as they are).
template <typename T>
absl::StatusOr<NamedHostTensor> FromValues(std::string name, Shape shape, SafetensorsDType dtype,
                                           absl::Span<const T> values) {
  int64_t n;
  if (!CheckedNumElements(shape, &n) || static_cast<uint64_t>(n) != values.size()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': shape ",
                                                   ShapeString(shape), " does not hold ",
                                                   values.size(), " values"));
  }
  NamedHostTensor t;
  t.name = std::move(name);
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data.resize(values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(t.data.data(), values.data(), t.data.size());
  return t;
}

}  // namespace

absl::StatusOr<NamedHostTensor> NamedHostTensor::FromFloats(std::string name, Shape shape,
                                                            absl::Span<const float> values) {
  return FromValues(std::move(name), std::move(shape), SafetensorsDType::kF32, values);
}

absl::StatusOr<NamedHostTensor> NamedHostTensor::FromInt64s(std::string name, Shape shape,
                                                            absl::Span<const int64_t> values) {
  return FromValues(std::move(name), std::move(shape), SafetensorsDType::kI64, values);
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
    // What ReadSafetensors takes: nothing is written that reads back refused.
    if (t.shape.size() > kMaxRank) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", t.name, "' has ",
                                                     t.shape.size(), " dimensions; at most ",
                                                     kMaxRank));
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

  // 3. The header, padded with spaces to 8 bytes.
  std::string header = HeaderJson(metadata, order);
  header.append((8 - header.size() % 8) % 8, ' ');
  if (header.size() > kMaxSafetensorsHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": a header of ", header.size(),
                                                   " bytes, above the ", kMaxSafetensorsHeaderBytes,
                                                   " a reader takes"));
  }
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
  // 1. Open and size the file (a FIFO is refused, never waited on).
  struct stat st;
  absl::StatusOr<int> fd = OpenRegularFile(path, &st);
  if (absl::IsFailedPrecondition(fd.status())) {
    return absl::InvalidArgumentError(fd.status().message());
  }
  PS_RETURN_IF_ERROR(fd.status());
  FilePtr file(::fdopen(*fd, "rb"));
  if (file == nullptr) {
    const int error = errno;
    ::close(*fd);
    return ErrnoError(error, path, "fdopen");
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
  PS_ASSIGN_OR_RETURN(ParsedHeader header, ParseHeader(path, header_text));
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
