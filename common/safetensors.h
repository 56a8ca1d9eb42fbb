#ifndef PS_COMMON_SAFETENSORS_H_
#define PS_COMMON_SAFETENSORS_H_

// Weights files in the safetensors format (https://huggingface.co/docs/safetensors),
// the format torch, JAX and the Hugging Face hub exchange models in:
//
//   [8 bytes]  N, the header length, unsigned little-endian
//   [N bytes]  a UTF-8 JSON object:
//                {"__metadata__": {"format": "pt"},          (optional)
//                 "conv1.weight": {"dtype": "F32", "shape": [6, 1, 5, 5],
//                                  "data_offsets": [0, 600]}, ...}
//              padded with spaces
//   [rest]     the tensors' bytes: each one contiguous, row-major,
//              little-endian, at [begin, end) relative to the end of the
//              header; together they cover the rest of the file exactly.
//
// Tensor names and layouts are PyTorch's (see worker/model/model.h), so a
// state_dict saved with safetensors.torch.save_file loads here and the other
// way round.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "common/tensor.h"

namespace ps {

// Element types a safetensors file can name. Training uses kF32; every type is
// read and written as raw bytes, and the numeric ones convert to float (see
// NamedHostTensor::ToFloats). kI64 matters in practice: PyTorch's batch norm
// saves num_batches_tracked as an I64 scalar.
enum class SafetensorsDType : int32_t {
  kBool,
  kU8,
  kI8,
  kF8E5M2,
  kF8E4M3,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kF64,
  kI64,
  kU64,
};

// Bytes per element (1, 2, 4 or 8).
int64_t SafetensorsDTypeSize(SafetensorsDType dtype);
// The file's spelling: "BOOL", "U8", "F8_E5M2", "BF16", "F32", "I64", ...
absl::string_view SafetensorsDTypeName(SafetensorsDType dtype);
// Inverse of SafetensorsDTypeName (case-sensitive); kInvalidArgument names an
// unknown string.
absl::StatusOr<SafetensorsDType> SafetensorsDTypeFromName(absl::string_view name);

// Between ps's element types and file types. ToDType is kUnimplemented for
// file types ps::DType cannot name (all but F32, F16, BF16, I32 and I64).
SafetensorsDType ToSafetensorsDType(DType dtype);
absl::StatusOr<DType> ToDType(SafetensorsDType dtype);

// One tensor as it lies in a file: raw little-endian bytes in host memory.
// Invariant of every tensor ReadSafetensors returns, and precondition of
// WriteSafetensors: data.size() == NumElements(shape) * SafetensorsDTypeSize(dtype).
struct NamedHostTensor {
  std::string name;  // PyTorch's: "fc1.weight", "bn1.num_batches_tracked"
  SafetensorsDType dtype = SafetensorsDType::kF32;
  Shape shape;  // [] is a scalar (one element); a 0 anywhere makes it empty
  std::vector<uint8_t> data;

  // An F32 / I64 tensor holding a copy of `values`; kInvalidArgument if a
  // dimension is negative or values.size() != NumElements(shape).
  static absl::StatusOr<NamedHostTensor> FromFloats(std::string name, Shape shape,
                                                    absl::Span<const float> values);
  static absl::StatusOr<NamedHostTensor> FromInt64s(std::string name, Shape shape,
                                                    absl::Span<const int64_t> values);

  int64_t num_elements() const;

  // The elements converted to float: exact for F32, F16, BF16, BOOL and the
  // 8/16-bit integers; integers above 2^24 in magnitude and F64 round to
  // nearest. So an I64 num_batches_tracked scalar becomes a one-element vector.
  // kUnimplemented for the F8 types; kInvalidArgument if data has the wrong
  // size for shape and dtype.
  absl::StatusOr<std::vector<float>> ToFloats() const;
  // The elements of an integer or BOOL tensor as int64; kInvalidArgument for
  // floating-point dtypes. U64 values above INT64_MAX are kOutOfRange (here
  // and in ToFloats).
  absl::StatusOr<std::vector<int64_t>> ToInt64s() const;
};

// The contents of one file.
struct SafetensorsFile {
  // In the order of their bytes in the file (data_offsets ascending), which is
  // also the header's order for files written by WriteSafetensors and by the
  // reference implementation.
  std::vector<NamedHostTensor> tensors;
  // "__metadata__": free-form strings, e.g. {"format": "pt"}. Empty if absent.
  std::map<std::string, std::string> metadata;

  // The tensor named `name`; kNotFound (naming it) if there is none. The
  // pointer lives as long as `tensors` is not modified.
  absl::StatusOr<const NamedHostTensor*> Find(absl::string_view name) const;
};

// Largest header ReadSafetensors accepts, in bytes (the reference
// implementation's limit too).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// Writes `tensors` and `metadata` to `path`, laid out as the reference
// implementation does: bytes sorted by dtype in the enum's reverse order
// (which puts larger elements first, so every tensor is aligned to its element
// size), then by name (bytewise); the header, compact JSON, lists
// "__metadata__" first (if non-empty), then the tensors in byte order, and is
// padded with spaces to a multiple of 8 bytes.
//
// Atomic: writes and fsyncs `path` + ".tmp", then renames it over `path`, so
// readers see the old file or the whole new one. On failure `path` is left
// untouched and the temporary file is removed. Thread-compatible: concurrent
// writers of the same `path` share the temporary file and must not overlap.
//
// Errors (each naming the file and the problem):
//   kInvalidArgument  duplicate names, a name "__metadata__",
//                     negative dimensions, more than 64 of them, data of
//                     the wrong size, names or metadata that are not valid
//                     UTF-8, a header over kMaxSafetensorsHeaderBytes
//                     (what ReadSafetensors would refuse).
//   others            from the file system (errno's mapping), e.g. kNotFound
//                     for a missing directory, kPermissionDenied.
absl::Status WriteSafetensors(const std::string& path, absl::Span<const NamedHostTensor> tensors,
                              const std::map<std::string, std::string>& metadata = {});

// Reads a whole file. Strict: anything the format does not allow is an error,
// and no allocation is sized from the file before it is checked against the
// file's actual size (a hostile header length cannot make it allocate); the
// header's parse takes memory proportional to its length. Thread-safe.
//
// Errors (each naming the file and the problem):
//   kNotFound         no file at `path` (other open/read failures map errno).
//   kDataLoss         the file is shorter than its header length says, or
//                     than the tensors' data_offsets say (truncated).
//   kInvalidArgument  not a regular file; header length above
//                     kMaxSafetensorsHeaderBytes; malformed JSON (with the
//                     byte offset in the header); JSON that is not a
//                     safetensors header (naming the tensor and field): a
//                     value of the wrong type or nested where the format
//                     has none, unknown dtype, unknown or missing fields,
//                     duplicate names or keys, a shape of more than 64
//                     dimensions, a dimension or offset that is negative,
//                     not an integer or beyond int64; data_offsets
//                     reversed, overlapping, leaving gaps, or not matching
//                     prod(shape) * dtype size; bytes after the last tensor.
absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path);

}  // namespace ps

#endif  // PS_COMMON_SAFETENSORS_H_
