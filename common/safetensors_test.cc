#include "common/safetensors.h"

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/testing/subprocess.h"

namespace ps {
namespace {

using ::testing::HasSubstr;


void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

bool Exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

std::string LengthPrefix(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return s;
}

// A file with `header` as its JSON and `data_bytes` zero bytes of data.
std::string RawFile(const std::string& header, size_t data_bytes) {
  return LengthPrefix(header.size()) + header + std::string(data_bytes, '\0');
}

// Writes a file and reads it back, returning the status.
absl::Status ReadRaw(const std::string& name, const std::string& bytes) {
  const std::string path = testing::TestTmpPath(name);
  WriteBytes(path, bytes);
  return ReadSafetensors(path).status();
}

std::vector<uint8_t> U16Bytes(std::vector<uint16_t> values) {
  std::vector<uint8_t> out(values.size() * 2);
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

std::vector<NamedHostTensor> SampleTensors() {
  std::vector<NamedHostTensor> tensors;
  std::vector<float> w(24);
  for (int i = 0; i < 24; ++i) w[i] = 0.25f * i - 3.f;
  tensors.push_back(*NamedHostTensor::FromFloats("conv1.weight", {2, 3, 2, 2}, w));
  tensors.push_back(*NamedHostTensor::FromFloats("conv1.bias", {2}, {0.5f, -1.5f}));
  tensors.push_back(*NamedHostTensor::FromFloats("scale", {}, {42.f}));
  tensors.push_back(*NamedHostTensor::FromFloats("empty", {0, 3}, {}));
  tensors.push_back(*NamedHostTensor::FromInt64s("bn1.num_batches_tracked", {}, {123}));
  NamedHostTensor half{"half", SafetensorsDType::kF16, {3}, U16Bytes({0x3C00, 0xC000, 0x3800})};
  NamedHostTensor bf16{"bf16", SafetensorsDType::kBF16, {2}, U16Bytes({0x3F80, 0xC020})};
  tensors.push_back(half);
  tensors.push_back(bf16);
  // Names that need escaping and non-ASCII ones survive.
  tensors.push_back(*NamedHostTensor::FromFloats("quote\"back\\slash\nnewline\x01 \xC3\xA9\xF0\x9F\x98\x80",
                                                 {1}, {7.f}));
  return tensors;
}

TEST(SafetensorsTest, RoundTrip) {
  const std::string path = testing::TestTmpPath("round_trip.safetensors");
  const std::vector<NamedHostTensor> tensors = SampleTensors();
  const std::map<std::string, std::string> metadata = {{"format", "pt"},
                                                       {"note", "tab\there \"q\" \xE2\x82\xAC"}};
  ASSERT_TRUE(WriteSafetensors(path, tensors, metadata).ok());
  EXPECT_FALSE(Exists(path + ".tmp"));

  absl::StatusOr<SafetensorsFile> file = ReadSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata, metadata);
  ASSERT_EQ(file->tensors.size(), tensors.size());
  for (const NamedHostTensor& want : tensors) {
    absl::StatusOr<const NamedHostTensor*> got = file->Find(want.name);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ((*got)->dtype, want.dtype) << want.name;
    EXPECT_EQ((*got)->shape, want.shape) << want.name;
    EXPECT_EQ((*got)->data, want.data) << want.name;
  }
  // The reference order: I64 first, then F32 by name, then BF16, then F16.
  std::vector<std::string> order;
  for (const NamedHostTensor& t : file->tensors) order.push_back(t.name);
  EXPECT_EQ(order, (std::vector<std::string>{"bn1.num_batches_tracked", "conv1.bias",
                                             "conv1.weight", "empty", tensors[7].name, "scale",
                                             "bf16", "half"}));

  EXPECT_EQ(*(*file->Find("bn1.num_batches_tracked"))->ToFloats(), std::vector<float>{123.f});
  EXPECT_EQ(*(*file->Find("half"))->ToFloats(), (std::vector<float>{1.f, -2.f, 0.5f}));
  EXPECT_EQ(*(*file->Find("bf16"))->ToFloats(), (std::vector<float>{1.f, -2.5f}));
  EXPECT_EQ(file->Find("missing").status().code(), absl::StatusCode::kNotFound);
}

TEST(SafetensorsTest, LayoutMatchesTheReferenceImplementation) {
  const std::string path = testing::TestTmpPath("layout.safetensors");
  std::vector<NamedHostTensor> tensors;
  tensors.push_back(*NamedHostTensor::FromFloats("b", {2}, {1.f, 2.f}));
  tensors.push_back(*NamedHostTensor::FromInt64s("a", {}, {7}));
  ASSERT_TRUE(WriteSafetensors(path, tensors, {{"format", "pt"}}).ok());

  std::string json =
      "{\"__metadata__\":{\"format\":\"pt\"},"
      "\"a\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,8]},"
      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}";
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string data(16, '\0');
  const int64_t seven = 7;
  const float values[2] = {1.f, 2.f};
  std::memcpy(&data[0], &seven, 8);
  std::memcpy(&data[8], values, 8);
  EXPECT_EQ(testing::ReadFileBytes(path), LengthPrefix(json.size()) + json + data);
  EXPECT_EQ(json.size() % 8, 0u);
}

TEST(SafetensorsTest, EmptyFileRoundTrips) {
  const std::string path = testing::TestTmpPath("empty.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {}).ok());
  EXPECT_EQ(testing::ReadFileBytes(path), LengthPrefix(8) + "{}      ");
  absl::StatusOr<SafetensorsFile> file = ReadSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(file->tensors.empty());
  EXPECT_TRUE(file->metadata.empty());
}

TEST(SafetensorsTest, OverwriteReplacesTheWholeFile) {
  const std::string path = testing::TestTmpPath("overwrite.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, SampleTensors()).ok());
  std::vector<NamedHostTensor> small = {*NamedHostTensor::FromFloats("x", {1}, {3.f})};
  ASSERT_TRUE(WriteSafetensors(path, small).ok());
  absl::StatusOr<SafetensorsFile> file = ReadSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(file->tensors.size(), 1u);
  EXPECT_EQ(*file->tensors[0].ToFloats(), std::vector<float>{3.f});
  EXPECT_FALSE(Exists(path + ".tmp"));
}

TEST(SafetensorsTest, WriteRejectsBadInputAndLeavesNoFile) {
  const std::string path = testing::TestTmpPath("bad_write.safetensors");
  const auto expect_invalid = [&](std::vector<NamedHostTensor> tensors,
                                  std::map<std::string, std::string> metadata,
                                  const std::string& substring) {
    absl::Status status = WriteSafetensors(path, tensors, metadata);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(path));
    EXPECT_THAT(std::string(status.message()), HasSubstr(substring));
    EXPECT_FALSE(Exists(path));
    EXPECT_FALSE(Exists(path + ".tmp"));
  };
  NamedHostTensor x = *NamedHostTensor::FromFloats("x", {2}, {1.f, 2.f});
  expect_invalid({x, x}, {}, "duplicate tensor name 'x'");
  NamedHostTensor short_data = x;
  short_data.data.pop_back();
  expect_invalid({short_data}, {}, "do not hold shape [2]");
  NamedHostTensor negative = x;
  negative.shape = {-2};
  expect_invalid({negative}, {}, "do not hold shape [-2]");
  NamedHostTensor reserved = x;
  reserved.name = "__metadata__";
  expect_invalid({reserved}, {}, "reserved");
  NamedHostTensor bad_utf8 = x;
  bad_utf8.name = "bad\xFF";
  expect_invalid({bad_utf8}, {}, "not valid UTF-8");
  expect_invalid({x}, {{"k", "\xC0\x80"}}, "not valid UTF-8");
  // Nothing is written that ReadSafetensors would refuse: 65 dimensions,
  // or a header over its limit (metadata of 100 MB).
  NamedHostTensor deep = x;
  deep.shape.assign(65, 1);
  deep.shape[0] = 2;
  expect_invalid({deep}, {}, "65 dimensions; at most 64");
  expect_invalid({x}, {{"big", std::string(kMaxSafetensorsHeaderBytes, 'a')}}, "a header of");

  absl::Status status = WriteSafetensors(testing::TestTmpPath("no/such/dir/x.safetensors"), {x});
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("no/such/dir/x.safetensors.tmp"));
}

TEST(SafetensorsTest, Conversions) {
  NamedHostTensor half{"h", SafetensorsDType::kF16, {5},
                       U16Bytes({0x0001, 0x8000, 0x7C00, 0x3555, 0x03FF})};
  std::vector<float> f = *half.ToFloats();
  EXPECT_EQ(f[0], 5.9604644775390625e-8f);  // smallest subnormal, 2^-24
  EXPECT_TRUE(std::signbit(f[1]) && f[1] == 0.f);
  EXPECT_TRUE(std::isinf(f[2]));
  EXPECT_EQ(f[3], 0.333251953125f);
  EXPECT_EQ(f[4], 6.097555160522461e-05f);  // largest subnormal

  NamedHostTensor bytes{"u8", SafetensorsDType::kU8, {3}, {0, 200, 255}};
  EXPECT_EQ(*bytes.ToFloats(), (std::vector<float>{0.f, 200.f, 255.f}));
  EXPECT_EQ(*bytes.ToInt64s(), (std::vector<int64_t>{0, 200, 255}));
  NamedHostTensor flags{"b", SafetensorsDType::kBool, {2}, {0, 1}};
  EXPECT_EQ(*flags.ToFloats(), (std::vector<float>{0.f, 1.f}));
  NamedHostTensor big{"u64", SafetensorsDType::kU64, {}, std::vector<uint8_t>(8, 0xFF)};
  EXPECT_EQ(big.ToInt64s().status().code(), absl::StatusCode::kOutOfRange);
  NamedHostTensor f8{"f8", SafetensorsDType::kF8E4M3, {1}, {0}};
  EXPECT_EQ(f8.ToFloats().status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(half.ToInt64s().status().code(), absl::StatusCode::kInvalidArgument);
  NamedHostTensor wrong_size{"w", SafetensorsDType::kF32, {2}, {0, 0, 0}};
  EXPECT_EQ(wrong_size.ToFloats().status().code(), absl::StatusCode::kInvalidArgument);

  EXPECT_EQ(NamedHostTensor::FromFloats("x", {2, 2}, {1.f}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NamedHostTensor::FromInt64s("x", {-1}, {}).status().code(),
            absl::StatusCode::kInvalidArgument);

  for (SafetensorsDType d : {SafetensorsDType::kBool, SafetensorsDType::kF8E5M2,
                             SafetensorsDType::kBF16, SafetensorsDType::kU64}) {
    EXPECT_EQ(*SafetensorsDTypeFromName(SafetensorsDTypeName(d)), d);
  }
  EXPECT_EQ(SafetensorsDTypeSize(SafetensorsDType::kI64), 8);
  EXPECT_EQ(SafetensorsDTypeFromName("f32").status().code(), absl::StatusCode::kInvalidArgument);
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16, DType::kI32, DType::kI64}) {
    EXPECT_EQ(*ToDType(ToSafetensorsDType(d)), d);
    EXPECT_EQ(SafetensorsDTypeName(ToSafetensorsDType(d)), DTypeName(d));
  }
  EXPECT_EQ(ToDType(SafetensorsDType::kU8).status().code(), absl::StatusCode::kUnimplemented);
}

template <typename T>
NamedHostTensor Elements(SafetensorsDType dtype, std::vector<T> values) {
  NamedHostTensor t{"t", dtype, {static_cast<int64_t>(values.size())},
                    std::vector<uint8_t>(values.size() * sizeof(T))};
  std::memcpy(t.data.data(), values.data(), t.data.size());
  return t;
}

// Each dtype's converters read its own element type: signed types keep their
// sign, unsigned ones their high bit.
TEST(SafetensorsTest, EveryDTypeConverts) {
  struct Case {
    NamedHostTensor tensor;
    std::vector<int64_t> ints;  // empty: not an integer type
    std::vector<float> floats;
  };
  const std::vector<Case> cases = {
      {Elements<uint8_t>(SafetensorsDType::kBool, {0, 1, 7}), {0, 1, 1}, {0.f, 1.f, 1.f}},
      {Elements<uint8_t>(SafetensorsDType::kU8, {0, 255}), {0, 255}, {0.f, 255.f}},
      {Elements<int8_t>(SafetensorsDType::kI8, {-128, 127}), {-128, 127}, {-128.f, 127.f}},
      {Elements<int16_t>(SafetensorsDType::kI16, {-32768, 300}), {-32768, 300}, {-32768.f, 300.f}},
      {Elements<uint16_t>(SafetensorsDType::kU16, {65535}), {65535}, {65535.f}},
      {Elements<int32_t>(SafetensorsDType::kI32, {-5, 1 << 30}), {-5, 1 << 30}, {-5.f, 0x1p30f}},
      {Elements<uint32_t>(SafetensorsDType::kU32, {4294967295u}), {4294967295}, {0x1p32f}},
      {Elements<int64_t>(SafetensorsDType::kI64, {-(int64_t{1} << 62)}),
       {-(int64_t{1} << 62)},
       {-0x1p62f}},
      {Elements<uint64_t>(SafetensorsDType::kU64, {uint64_t{1} << 62}),
       {int64_t{1} << 62},
       {0x1p62f}},
      {Elements<uint16_t>(SafetensorsDType::kF16, {0xC500}), {}, {-5.f}},
      {Elements<uint16_t>(SafetensorsDType::kBF16, {0xC0A0}), {}, {-5.f}},
      {Elements<float>(SafetensorsDType::kF32, {-5.f, 0.1f}), {}, {-5.f, 0.1f}},
      {Elements<double>(SafetensorsDType::kF64, {-5.0, 0.1}), {}, {-5.f, 0.1f}},
  };
  for (const Case& c : cases) {
    const std::string dtype(SafetensorsDTypeName(c.tensor.dtype));
    absl::StatusOr<std::vector<float>> floats = c.tensor.ToFloats();
    ASSERT_TRUE(floats.ok()) << dtype << ": " << floats.status();
    EXPECT_EQ(*floats, c.floats) << dtype;
    absl::StatusOr<std::vector<int64_t>> ints = c.tensor.ToInt64s();
    if (c.ints.empty()) {
      EXPECT_EQ(ints.status().code(), absl::StatusCode::kInvalidArgument) << dtype;
    } else {
      ASSERT_TRUE(ints.ok()) << dtype << ": " << ints.status();
      EXPECT_EQ(*ints, c.ints) << dtype;
    }
  }
}

TEST(SafetensorsTest, MissingFile) {
  const std::string path = testing::TestTmpPath("does_not_exist.safetensors");
  absl::Status status = ReadSafetensors(path).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(status.message()), HasSubstr(path));
}

TEST(SafetensorsTest, DirectoryIsNotAFile) {
  absl::Status status = ReadSafetensors(testing::TestTmpPath("")).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("not a regular file"));
}

TEST(SafetensorsTest, HostileHeaderLengths) {
  // Lengths that an allocator would choke on must be refused from the number
  // alone, before any allocation.
  for (uint64_t n : {~uint64_t{0}, uint64_t{1} << 63, uint64_t{1} << 40,
                     kMaxSafetensorsHeaderBytes + 1}) {
    absl::Status status = ReadRaw("hostile.safetensors", LengthPrefix(n) + "{}");
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << n << ": " << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr("exceeds the limit")) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr("hostile.safetensors"));
  }
  // Within the limit but beyond the file.
  absl::Status status = ReadRaw("long_header.safetensors", LengthPrefix(1000) + "{}");
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("header length 1000 exceeds the 2 bytes"));
  // Too short to hold the length itself.
  status = ReadRaw("tiny.safetensors", "abc");
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  status = ReadRaw("zero.safetensors", "");
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
}

struct MalformedCase {
  std::string header;
  std::string message;  // expected in the status
  std::string also = "malformed safetensors header";  // expected too
};

// JSON syntax errors (found by nlohmann-json) give the byte offset in the
// header and nlohmann's description; schema errors name the tensor and the
// field.
TEST(SafetensorsTest, MalformedJsonSaysWhere) {
  const std::string t = "\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}";
  const std::vector<MalformedCase> cases = {
      {"", "header byte 0: the header must start with '{'"},
      {" {}", "header byte 0: the header must start with '{'"},
      {"[]", "must start with '{'"},
      {"{" + t,
       "header byte 53: syntax error while parsing object - unexpected end of input; "
       "expected '}'"},
      {"{" + t + ",}",
       "header byte 54: syntax error while parsing object key - unexpected '}'; "
       "expected string literal"},
      {"{" + t + "}x", "header byte 54: syntax error while parsing value", "expected end of input"},
      {"{}{}",
       "header byte 2: syntax error while parsing value - unexpected '{'; "
       "expected end of input"},
      {"{\"t\" {}}",
       "header byte 5: syntax error while parsing object separator - "
       "unexpected '{'; expected ':'"},
      {"{\"t",
       "header byte 3: syntax error while parsing object key - invalid string: "
       "missing closing quote"},
      {"{\"t\\q\":{}}",
       "header byte 4: syntax error while parsing object key - invalid string: "
       "forbidden character after backslash"},
      {"{\"t\\u12x4\":{}}",
       "header byte 7: syntax error while parsing object key - "
       "invalid string: '\\u' must be followed by 4 hex digits"},
      {"{\"t\\u12", "header byte 7", "'\\u' must be followed by 4 hex digits"},  // truncated
      {"{\"\\udc00\":{}}", "header byte 7", "surrogate U+DC00..U+DFFF must follow U+D800..U+DBFF"},
      {"{\"\\ud800x\":{}}", "header byte 8",
       "surrogate U+D800..U+DBFF must be followed by U+DC00..U+DFFF"},
      {"{\"\\ud800\\u0041\":{}}", "header byte 13",
       "surrogate U+D800..U+DBFF must be followed by U+DC00..U+DFFF"},
      {"{\"a\nb\":{}}", "header byte 3", "invalid string: control character U+000A (LF)"},
      {"{\"a\xFF\":{}}", "header byte 3", "invalid string: ill-formed UTF-8 byte"},
      {"{\"a\xED\xA0\x80\":{}}", "header byte 4", "ill-formed UTF-8 byte"},  // a surrogate
      {"{\"t\":[]}", "expected an object for tensor 't'"},
      {"{\"t\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}",
       "the shape of tensor 't' holds 1.5, which is not an integer"},
      {"{\"t\":{\"dtype\":\"F32\",\"shape\":[1e3],\"data_offsets\":[0,4]}}",
       "fraction or exponent"},
      {"{\"t\":{\"dtype\":\"F32\",\"shape\":[01],\"data_offsets\":[0,4]}}",  // a leading zero
       "header byte 30: syntax error while parsing array - unexpected number literal"},
      {"{\"t\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,4]}}",
       "the shape of tensor 't' holds 99999999999999999999, out of the 64-bit range"},
      {"{\"t\":{\"dtype\":\"F32\",\"shape\":[9223372036854775808],\"data_offsets\":[0,4]}}",
       "holds 9223372036854775808, out of the 64-bit range"},  // INT64_MAX + 1
      {"{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,-99999999999999999999]}}",
       "the data_offsets of tensor 't' holds -99999999999999999999, out of the 64-bit range"},
      {"{\"t\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}",
       "negative value in the shape of tensor 't'"},
      {"{\"t\":{\"dtype\":\"F32\",\"shape\":[-],\"data_offsets\":[0,4]}}",
       "header byte 30: syntax error while parsing value - invalid number; "
       "expected digit after '-'"},
      {"{\"t\":{\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]}}",
       "expected an integer in the shape of tensor 't', found a string"},
      {"{\"t\":{\"dtype\":\"F32\",\"shape\":3,\"data_offsets\":[0,4]}}",
       "expected an array for the shape of tensor 't'"},
      {"{\"t\":{\"dtype\":\"F32\",\"shape\":[1 2],\"data_offsets\":[0,4]}}",
       "header byte 31: syntax error while parsing array - unexpected number literal; "
       "expected ']'"},
      {"{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}",
       "the data_offsets of tensor 't' has more than 2 elements"},
      {"{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4]}}",
       "data_offsets of tensor 't' must be [begin, end]"},
      {"{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,-4]}}", "negative value"},
      {"{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}",
       "unknown field 'x' in tensor 't'"},
      {"{\"t\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
       "duplicate field 'dtype' in tensor 't'"},
      {"{\"t\":{\"shape\":[1],\"data_offsets\":[0,4]}}", "tensor 't' lacks \"dtype\""},
      {"{\"t\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", "tensor 't' lacks \"shape\""},
      {"{\"t\":{\"dtype\":\"F32\",\"shape\":[1]}}", "tensor 't' lacks \"data_offsets\""},
      {"{\"t\":{\"dtype\":3,\"shape\":[1],\"data_offsets\":[0,4]}}",
       "the dtype of tensor 't' must be a string, found a number"},
      {"{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"t\":{}}",
       "duplicate tensor name 't'"},
      {"{\"__metadata__\":{\"a\":1}}", "\"__metadata__\" values must be strings"},
      {"{\"__metadata__\":{\"a\":\"x\",\"a\":\"y\"}}", "duplicate key in \"__metadata__\""},
      {"{\"__metadata__\":{},\"__metadata__\":{}}", "duplicate \"__metadata__\""},
      {"{\"__metadata__\":[]}", "expected an object for \"__metadata__\""},
      {"{\"t\":null}", "expected an object"},
  };
  for (const MalformedCase& c : cases) {
    absl::Status status = ReadRaw("malformed.safetensors", RawFile(c.header, 4));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.header << " -> " << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.message)) << c.header;
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.also)) << c.header;
    EXPECT_THAT(std::string(status.message()), HasSubstr("malformed.safetensors")) << c.header;
  }
}

TEST(SafetensorsTest, RankIsBounded) {
  std::string shape = "1";
  for (int i = 1; i < 65; ++i) shape += ",1";
  absl::Status status = ReadRaw(
      "rank.safetensors",
      RawFile("{\"t\":{\"dtype\":\"F32\",\"shape\":[" + shape + "],\"data_offsets\":[0,4]}}", 4));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("more than 64 elements"));
  // 64 dimensions are fine.
  shape = shape.substr(2);
  absl::StatusOr<SafetensorsFile> file = [&] {
    const std::string path = testing::TestTmpPath("rank64.safetensors");
    WriteBytes(path, RawFile("{\"t\":{\"dtype\":\"F32\",\"shape\":[" + shape +
                                 "],\"data_offsets\":[0,4]}}",
                             4));
    return ReadSafetensors(path);
  }();
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->tensors[0].shape.size(), 64u);
}

TEST(SafetensorsTest, DeepNestingFailsAtItsFirstBracket) {
  // Nesting a recursive parser would overflow the stack on. The schema allows
  // three levels, so each fails where the first bracket too many is, whether
  // or not the brackets close.
  const std::string deep_array = std::string(1000000, '[') + std::string(1000000, ']');
  const std::string deep_object = [] {
    std::string s;
    for (int i = 0; i < 200000; ++i) s += "{\"a\":";
    return s + "1" + std::string(200000, '}');
  }();
  const std::vector<MalformedCase> cases = {
      {"{\"t\":" + deep_array + "}", "expected an object for tensor 't', found an array"},
      {"{\"t\":" + deep_object + "}", "unknown field 'a' in tensor 't'"},
      {"{\"t\":{\"shape\":" + deep_array + "}}",
       "expected an integer in the shape of tensor 't', found an array"},
      {"{\"t\":{\"dtype\":" + deep_object + "}}",
       "the dtype of tensor 't' must be a string, found an object"},
      {"{\"__metadata__\":{\"k\":" + deep_array + "}}",
       "\"__metadata__\" values must be strings; 'k' holds an array"},
      {"{\"__metadata__\":" + deep_array + "}", "expected an object for \"__metadata__\""},
      // Unclosed, so the error could only be found at the end of the header.
      {"{\"t\":{\"shape\":" + std::string(5000000, '['),
       "expected an integer in the shape of tensor 't', found an array"},
  };
  for (const MalformedCase& c : cases) {
    absl::Status status = ReadRaw("deep.safetensors", RawFile(c.header, 4));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.message));
    EXPECT_THAT(std::string(status.message()), HasSubstr("deep.safetensors"));
  }
}

TEST(SafetensorsTest, DuplicateKeysAreRefusedAtEveryLevel) {
  // JSON parsers commonly keep the last of duplicate keys; a header that
  // means two things is refused instead.
  const std::string t = "{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}";
  const std::vector<MalformedCase> cases = {
      {"{\"t\":" + t + ",\"u\":" + t + ",\"t\":" + t + "}", "duplicate tensor name 't'"},
      {"{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"shape\":[1],\"data_offsets\":[0,4]}}",
       "duplicate field 'shape' in tensor 't'"},
      {"{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],"
       "\"data_offsets\":[0,4]}}",
       "duplicate field 'data_offsets' in tensor 't'"},
      {"{\"__metadata__\":{\"k\":\"1\",\"j\":\"2\",\"k\":\"1\"},\"t\":" + t + "}",
       "duplicate key in \"__metadata__\": 'k'"},
      {"{\"__metadata__\":{},\"t\":" + t + ",\"__metadata__\":{}}", "duplicate \"__metadata__\""},
      // Keys equal once their escapes are decoded.
      {"{\"t\":" + t + ",\"\\u0074\":" + t + "}", "duplicate tensor name 't'"},
  };
  for (const MalformedCase& c : cases) {
    absl::Status status = ReadRaw("duplicate.safetensors", RawFile(c.header, 4));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.header << " -> " << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.message)) << c.header;
  }
}

TEST(SafetensorsTest, WrittenHeaderEscapesWhatJsonRequires) {
  const std::string path = testing::TestTmpPath("escapes.safetensors");
  const std::string name = "q\"b\\n\n\x01\x1f/\x7f\xC3\xA9";
  ASSERT_TRUE(WriteSafetensors(path, {*NamedHostTensor::FromFloats(name, {}, {1.f})},
                               {{"k\t", "\xE2\x82\xAC"}})
                  .ok());
  std::string json =
      "{\"__metadata__\":{\"k\\t\":\"\xE2\x82\xAC\"},"
      "\"q\\\"b\\\\n\\n\\u0001\\u001f/\x7f\xC3\xA9\":"
      "{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}";
  json.append((8 - json.size() % 8) % 8, ' ');
  const float one = 1.f;
  EXPECT_EQ(testing::ReadFileBytes(path),
            LengthPrefix(json.size()) + json + std::string(reinterpret_cast<const char*>(&one), 4));
}

// A header with many tensors reads and writes in time linear in its size (a
// parser that rescans the object per member would take minutes here).
TEST(SafetensorsTest, ManyTensors) {
  const std::string path = testing::TestTmpPath("many.safetensors");
  constexpr int kCount = 200000;
  std::vector<NamedHostTensor> tensors;
  tensors.reserve(kCount);
  for (int i = 0; i < kCount; ++i) {
    tensors.push_back(*NamedHostTensor::FromFloats("layer" + std::to_string(i) + ".bias", {1},
                                                   {static_cast<float>(i)}));
  }
  ASSERT_TRUE(WriteSafetensors(path, tensors).ok());
  absl::StatusOr<SafetensorsFile> file = ReadSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(file->tensors.size(), static_cast<size_t>(kCount));
  EXPECT_EQ(*(*file->Find("layer12345.bias"))->ToFloats(), std::vector<float>{12345.f});
}

std::string Entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  int64_t begin, int64_t end) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
         ",\"data_offsets\":[" + std::to_string(begin) + "," + std::to_string(end) + "]}";
}

TEST(SafetensorsTest, InconsistentHeaders) {
  struct Case {
    std::string header;
    size_t data_bytes;
    absl::StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"{" + Entry("t", "Q4", "[1]", 0, 4) + "}", 4, absl::StatusCode::kInvalidArgument,
       "tensor 't': unknown dtype 'Q4'"},
      {"{" + Entry("t", "F32", "[2]", 0, 4) + "}", 4, absl::StatusCode::kInvalidArgument,
       "tensor 't': shape [2] of F32 needs 8 bytes but data_offsets [0, 4] hold 4"},
      {"{" + Entry("t", "F32", "[1]", 4, 0) + "}", 4, absl::StatusCode::kInvalidArgument,
       "are reversed"},
      {"{" + Entry("t", "F32", "[4294967296,4294967296]", 0, 4) + "}", 4,
       absl::StatusCode::kInvalidArgument, "too large for 64-bit sizes"},
      {"{" + Entry("a", "F32", "[2]", 0, 8) + "," + Entry("b", "F32", "[2]", 4, 12) + "}", 12,
       absl::StatusCode::kInvalidArgument, "tensor 'b' (data_offsets [4, 12]) overlaps tensor 'a'"},
      {"{" + Entry("a", "F32", "[1]", 0, 4) + "," + Entry("b", "F32", "[1]", 0, 4) + "}", 4,
       absl::StatusCode::kInvalidArgument, "overlaps"},
      {"{" + Entry("a", "F32", "[1]", 0, 4) + "," + Entry("b", "F32", "[1]", 8, 12) + "}", 12,
       absl::StatusCode::kInvalidArgument, "gap of 4 bytes in the data before tensor 'b'"},
      {"{" + Entry("a", "F32", "[1]", 4, 8) + "}", 8, absl::StatusCode::kInvalidArgument,
       "gap of 4 bytes"},
      {"{" + Entry("a", "F32", "[1]", 0, 4) + "}", 6, absl::StatusCode::kInvalidArgument,
       "2 unexpected bytes after the last tensor"},
      {"{" + Entry("a", "F32", "[2]", 0, 8) + "}", 5, absl::StatusCode::kDataLoss,
       "data_offsets [0, 8] lie beyond the 5 bytes of data"},
      {"{" + Entry("a", "U8", "[4]", 4611686018427387904, 4611686018427387908) + "}", 4,
       absl::StatusCode::kDataLoss, "lie beyond the 4 bytes"},
  };
  for (const Case& c : cases) {
    absl::Status status = ReadRaw("inconsistent.safetensors", RawFile(c.header, c.data_bytes));
    EXPECT_EQ(status.code(), c.code) << c.header << " -> " << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.message)) << c.header;
    EXPECT_THAT(std::string(status.message()), HasSubstr("inconsistent.safetensors"));
  }
  // Zero-sized tensors may share an offset, and whitespace padding is fine.
  const std::string path = testing::TestTmpPath("zero_sized.safetensors");
  WriteBytes(path, RawFile("{" + Entry("a", "F32", "[0]", 0, 0) + " , " +
                               Entry("b", "I64", "[2,0]", 0, 0) + "," +
                               Entry("c", "F32", "[1]", 0, 4) + "}  \n\t",
                           4));
  absl::StatusOr<SafetensorsFile> file = ReadSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->tensors.size(), 3u);
  // Tensors that share an offset keep the header's order.
  WriteBytes(
      path,
      RawFile("{" + Entry("z", "F32", "[0]", 0, 0) + "," + Entry("c", "F32", "[1]", 0, 4) + "," +
                  Entry("a", "U8", "[0]", 4, 4) + "," + Entry("b", "I64", "[0]", 0, 0) + "}",
              4));
  file = ReadSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<std::string> names;
  for (const NamedHostTensor& t : file->tensors) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"z", "b", "c", "a"}));
}

TEST(SafetensorsTest, TruncatedFilesAreErrorsNotCrashes) {
  const std::string path = testing::TestTmpPath("truncate_src.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, SampleTensors(), {{"format", "pt"}}).ok());
  const std::string bytes = testing::ReadFileBytes(path);
  for (size_t n = 0; n < bytes.size(); ++n) {
    absl::Status status = ReadRaw("truncated.safetensors", bytes.substr(0, n));
    EXPECT_FALSE(status.ok()) << n;
  }
  // Chopping data bytes is reported as truncation.
  absl::Status status = ReadRaw("truncated.safetensors", bytes.substr(0, bytes.size() - 1));
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("truncated"));
}

TEST(SafetensorsTest, CorruptedHeadersNeverCrash) {
  const std::string path = testing::TestTmpPath("corrupt_src.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, SampleTensors(), {{"format", "pt"}}).ok());
  const std::string bytes = testing::ReadFileBytes(path);
  uint64_t header_size;
  std::memcpy(&header_size, bytes.data(), 8);
  std::mt19937 rng(1234);
  int failures = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    std::string corrupt = bytes;
    const int flips = 1 + trial % 3;
    for (int k = 0; k < flips; ++k) {
      const size_t at = rng() % (8 + header_size);
      corrupt[at] = static_cast<char>(rng());
    }
    absl::StatusOr<SafetensorsFile> file = [&] {
      const std::string p = testing::TestTmpPath("corrupt.safetensors");
      WriteBytes(p, corrupt);
      return ReadSafetensors(p);
    }();
    if (!file.ok()) {
      ++failures;
      EXPECT_THAT(std::string(file.status().message()), HasSubstr("corrupt.safetensors"));
    }
  }
  EXPECT_GT(failures, 1000);
}

}  // namespace
}  // namespace ps
