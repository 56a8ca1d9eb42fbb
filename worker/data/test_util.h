#ifndef PS_WORKER_DATA_TEST_UTIL_H_
#define PS_WORKER_DATA_TEST_UTIL_H_

// Helpers for data-layer tests: scratch directories and dataset files built
// in memory (IDX headers, gzip), written byte for byte.

#include <cstdint>
#include <string>
#include <vector>

namespace ps::worker::data::testing {

using Bytes = std::vector<uint8_t>;

// A fresh, empty directory for one test: $TEST_TMPDIR/<name> (bazel test sets
// TEST_TMPDIR; /tmp otherwise). Removes what a previous run left there.
std::string TestDir(const std::string& name);

// Writes `bytes` to `path`, replacing it. Fails the test (ADD_FAILURE) on error.
void WriteFile(const std::string& path, const Bytes& bytes);

// `bytes` as one gzip member (zlib, default level).
Bytes Gzip(const Bytes& bytes);

// IDX files: a big-endian header, then the data.
Bytes IdxImages(uint32_t n, uint32_t rows, uint32_t cols, const Bytes& pixels);
Bytes IdxLabels(uint32_t n, const Bytes& labels);
// A header alone with any magic and dimensions (for corrupt files).
Bytes IdxHeader(uint32_t magic, const std::vector<uint32_t>& dims);

// `size` bytes of a varied, deterministic pattern that starts at `start`.
Bytes PatternBytes(int64_t size, uint8_t start);

}  // namespace ps::worker::data::testing

#endif  // PS_WORKER_DATA_TEST_UTIL_H_
