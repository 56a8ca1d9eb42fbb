#include "worker/data/test_util.h"

#include <zlib.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "gtest/gtest.h"

namespace ps::worker::data::testing {
namespace {

void AppendBigEndian32(uint32_t value, Bytes* out) {
  for (int shift = 24; shift >= 0; shift -= 8) out->push_back((value >> shift) & 0xff);
}

}  // namespace

std::string TestDir(const std::string& name) {
  const char* root = std::getenv("TEST_TMPDIR");
  const std::filesystem::path dir =
      std::filesystem::path(root != nullptr ? root : "/tmp") / ("ps_data_" + name);
  std::error_code error;
  std::filesystem::remove_all(dir, error);
  std::filesystem::create_directories(dir, error);
  if (error) ADD_FAILURE() << "cannot create " << dir << ": " << error.message();
  return dir.string();
}

void WriteFile(const std::string& path, const Bytes& bytes) {
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) {
    ADD_FAILURE() << "cannot create " << path;
    return;
  }
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), file) != bytes.size()) {
    ADD_FAILURE() << "cannot write " << path;
  }
  std::fclose(file);
}

Bytes Gzip(const Bytes& bytes) {
  z_stream stream{};
  // windowBits 15 + 16: a gzip header and trailer rather than zlib's.
  if (deflateInit2(&stream, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) !=
      Z_OK) {
    ADD_FAILURE() << "deflateInit2 failed";
    return {};
  }
  Bytes out(deflateBound(&stream, bytes.size()) + 64);
  stream.next_in = const_cast<Bytef*>(bytes.data());
  stream.avail_in = static_cast<uInt>(bytes.size());
  stream.next_out = out.data();
  stream.avail_out = static_cast<uInt>(out.size());
  if (deflate(&stream, Z_FINISH) != Z_STREAM_END) ADD_FAILURE() << "deflate failed";
  out.resize(stream.total_out);
  deflateEnd(&stream);
  return out;
}

Bytes IdxHeader(uint32_t magic, const std::vector<uint32_t>& dims) {
  Bytes out;
  AppendBigEndian32(magic, &out);
  for (uint32_t d : dims) AppendBigEndian32(d, &out);
  return out;
}

Bytes IdxImages(uint32_t n, uint32_t rows, uint32_t cols, const Bytes& pixels) {
  Bytes out = IdxHeader(0x00000803, {n, rows, cols});
  out.insert(out.end(), pixels.begin(), pixels.end());
  return out;
}

Bytes IdxLabels(uint32_t n, const Bytes& labels) {
  Bytes out = IdxHeader(0x00000801, {n});
  out.insert(out.end(), labels.begin(), labels.end());
  return out;
}

Bytes PatternBytes(int64_t size, uint8_t start) {
  Bytes out(size);
  for (int64_t i = 0; i < size; ++i) out[i] = static_cast<uint8_t>(start + 7 * i + i / 13);
  return out;
}

}  // namespace ps::worker::data::testing
