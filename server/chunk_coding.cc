#include "server/chunk_coding.h"

#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "common/wire_codec.h"
#include "server/shared_memory_sessions.h"

namespace ps::server {
namespace {

// f32: the values themselves, little-endian.
class F32Coding final : public ChunkCoding {
 public:
  absl::string_view name() const override { return "f32"; }
  proto::DType dtype() const override { return proto::DTYPE_F32; }
  proto::Encoding encoding() const override { return proto::ENCODING_DENSE; }
  bool Receives(ChunkSource) const override { return true; }
  bool in_place() const override { return true; }
  absl::StatusOr<int64_t> DecodedElements(int64_t data_bytes, int64_t) const override {
    if (data_bytes < 0 || data_bytes % 4 != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "carries ", data_bytes, " bytes, not a whole number of F32 elements"));
    }
    return data_bytes / 4;
  }
  absl::Status Decode(absl::Span<const absl::string_view> pieces,
                      absl::Span<float> out) const override {
    return (*WireCodecForDType(DType::kF32))->Decode(pieces, out);
  }
  std::optional<int64_t> EncodedBytes(absl::Span<const float> values,
                                      absl::Span<const float>) const override {
    return static_cast<int64_t>(values.size() * sizeof(float));
  }
  void Encode(absl::Span<const float> values, absl::Span<const float>,
              void* out) const override {
    (*WireCodecForDType(DType::kF32))->Encode(values, out);
  }
};

// f16 and bf16: 2 bytes per element, rounded from fp32 by `codec`.
class HalfCoding final : public ChunkCoding {
 public:
  HalfCoding(absl::string_view name, proto::DType dtype, const WireCodec* codec)
      : name_(name), dtype_(dtype), codec_(codec) {}
  absl::string_view name() const override { return name_; }
  proto::DType dtype() const override { return dtype_; }
  proto::Encoding encoding() const override { return proto::ENCODING_DENSE; }
  bool Receives(ChunkSource source) const override { return source == ChunkSource::kPush; }
  absl::StatusOr<int64_t> DecodedElements(int64_t data_bytes, int64_t) const override {
    if (data_bytes < 0 || data_bytes % 2 != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "carries ", data_bytes, " bytes, not a whole number of ", codec_->name(), " elements"));
    }
    return data_bytes / 2;
  }
  absl::Status Decode(absl::Span<const absl::string_view> pieces,
                      absl::Span<float> out) const override {
    return codec_->Decode(pieces, out);
  }
  std::optional<int64_t> EncodedBytes(absl::Span<const float> values,
                                      absl::Span<const float>) const override {
    return codec_->EncodedBytes(static_cast<int64_t>(values.size()));
  }
  void Encode(absl::Span<const float> values, absl::Span<const float>,
              void* out) const override {
    codec_->Encode(values, out);
  }

 private:
  const absl::string_view name_;
  const proto::DType dtype_;
  const WireCodec* const codec_;
};

// topk: (uint32 index, f32 value) pairs into the chunk's whole length,
// zero elsewhere. The server receives them only: it never sends top-k.
class TopKCoding final : public ChunkCoding {
 public:
  absl::string_view name() const override { return "topk"; }
  proto::DType dtype() const override { return proto::DTYPE_F32; }
  proto::Encoding encoding() const override { return proto::ENCODING_TOPK; }
  bool Receives(ChunkSource source) const override { return source == ChunkSource::kPush; }
  bool expands() const override { return true; }
  absl::StatusOr<int64_t> DecodedElements(int64_t, int64_t chunk_length) const override {
    if (chunk_length < 0) return absl::OutOfRangeError("no such chunk");
    return chunk_length;  // Decode checks the pairs
  }
  absl::Status Decode(absl::Span<const absl::string_view> pieces,
                      absl::Span<float> out) const override {
    return DecodeTopK(pieces, out);
  }
  std::optional<int64_t> EncodedBytes(absl::Span<const float>,
                                      absl::Span<const float>) const override {
    return std::nullopt;
  }
  void Encode(absl::Span<const float>, absl::Span<const float>, void*) const override {}
};

// delta: top-k's pairs for the elements that changed since the version the
// receiver holds. The server sends them only, where smaller than f32.
class DeltaCoding final : public ChunkCoding {
 public:
  absl::string_view name() const override { return "delta"; }
  proto::DType dtype() const override { return proto::DTYPE_F32; }
  proto::Encoding encoding() const override { return proto::ENCODING_DELTA; }
  bool Receives(ChunkSource) const override { return false; }
  absl::StatusOr<int64_t> DecodedElements(int64_t, int64_t) const override {
    return absl::InvalidArgumentError("delta chunks are only sent, never received");
  }
  absl::Status Decode(absl::Span<const absl::string_view>, absl::Span<float>) const override {
    return absl::InvalidArgumentError("delta chunks are only sent, never received");
  }
  std::optional<int64_t> EncodedBytes(absl::Span<const float> values,
                                      absl::Span<const float> previous) const override {
    if (previous.size() != values.size() || values.empty()) return std::nullopt;
    // Its pairs (8 bytes) must take less than the dense chunk (4 bytes an
    // element): fewer than half the elements changed.
    const int64_t limit = (static_cast<int64_t>(values.size()) + 1) / 2;
    const int64_t changed = CountChanged(values, previous, limit);
    if (changed >= limit) return std::nullopt;
    return changed * 8;
  }
  void Encode(absl::Span<const float> values, absl::Span<const float> previous,
              void* out) const override {
    EncodeChanged(values, previous, out);
  }
};

void ReleaseKeepAlive(void* keep_alive) {
  delete static_cast<std::shared_ptr<const void>*>(keep_alive);
}

// Why a received chunk's (dtype, encoding) is refused in a message from
// `source` (the wording workers have always seen).
absl::Status EncodingRefused(const ReceivedChunks& message, const proto::TensorChunk& chunk) {
  if (chunk.encoding() != proto::ENCODING_DENSE) {
    return absl::InvalidArgumentError(absl::StrCat(
        message.what, " of key ", chunk.key(), " has encoding ", chunk.encoding(), " and dtype ",
        chunk.dtype(), "; pushes may be top-k pairs of F32 values, nothing else sparse"));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      message.what, " of key ", chunk.key(), " has dtype ", chunk.dtype(), "; only F32",
      message.source == ChunkSource::kPush ? ", F16 and BF16" : "", " are supported here"));
}

}  // namespace

absl::StatusOr<const ChunkCoding*> ChunkCodingFor(proto::DType dtype, proto::Encoding encoding) {
  static const F32Coding* const f32 = new F32Coding;
  static const HalfCoding* const f16 =
      new HalfCoding("f16", proto::DTYPE_F16, *WireCodecForDType(DType::kF16));
  static const HalfCoding* const bf16 =
      new HalfCoding("bf16", proto::DTYPE_BF16, *WireCodecForDType(DType::kBF16));
  static const TopKCoding* const topk = new TopKCoding;
  static const DeltaCoding* const delta = new DeltaCoding;
  for (const ChunkCoding* coding : {static_cast<const ChunkCoding*>(f32),
                                    static_cast<const ChunkCoding*>(f16),
                                    static_cast<const ChunkCoding*>(bf16),
                                    static_cast<const ChunkCoding*>(topk),
                                    static_cast<const ChunkCoding*>(delta)}) {
    if (coding->dtype() == dtype && coding->encoding() == encoding) return coding;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "no coding for dtype ", dtype, " and encoding ", encoding,
      "; known: f32, f16, bf16 (dense), topk and delta (F32)"));
}

absl::StatusOr<std::vector<ParameterServer::ChunkBytes>> DecodeReceivedChunks(
    const ReceivedChunks& message,
    const google::protobuf::RepeatedPtrField<proto::TensorChunk>& header_chunks,
    const proto::FrameReader& frame, DecodedChunks* decoded) {
  std::vector<ParameterServer::ChunkBytes> chunks;
  chunks.reserve(header_chunks.size());
  // Stable addresses: each chunk's piece is pointed at.
  decoded->values.reserve(header_chunks.size());
  decoded->pieces.reserve(header_chunks.size());
  // A buffer for a chunk's fp32 values, held in `decoded`, as the domain's
  // piece once filled.
  auto buffer = [&](const proto::TensorChunk& chunk, int64_t elements) {
    std::vector<float>& values = decoded->values.emplace_back(elements);
    decoded->pieces.emplace_back(reinterpret_cast<const char*>(values.data()),
                                 values.size() * sizeof(float));
    chunks.push_back({chunk.key(), chunk.chunk(), absl::MakeConstSpan(&decoded->pieces.back(), 1)});
    return absl::MakeSpan(values);
  };
  // What a message decodes or copies into buffers of its own stays within
  // one message's max_decoded_elements, checked before each buffer is
  // allocated: a top-k entry costs a few header bytes but decodes into its
  // chunk's whole length, and a shared-memory entry copies up to the whole
  // segment. (f32 chunks are read in place, and f16 and bf16 ones decode
  // into twice their bytes on the wire, which gRPC's receive limit bounds.)
  int64_t decoded_elements = 0;
  auto count = [&](const proto::TensorChunk& chunk, int64_t elements) -> absl::Status {
    decoded_elements += elements;
    if (decoded_elements > message.max_decoded_elements) {
      return absl::InvalidArgumentError(absl::StrCat(
          message.what, " decodes to more than ", message.max_decoded_elements,
          " elements in one message (at key ", chunk.key(), " chunk ", chunk.chunk(),
          "); split it"));
    }
    return absl::OkStatus();
  };
  for (int c = 0; c < header_chunks.size(); ++c) {
    const proto::TensorChunk& chunk = header_chunks[c];
    if (chunk.in_shared_memory()) {
      PS_ASSIGN_OR_RETURN(const int64_t elements,
                          SharedMemoryChunkElements(message.shared_memory, chunk,
                                                    message.source == ChunkSource::kPush,
                                                    message.what));
      PS_RETURN_IF_ERROR(count(chunk, elements));
      // Copied out before anything reads it: the worker can write its
      // memory at any time, and the checks must see what is summed.
      CopyFromSharedMemory(*message.shared_memory, chunk, buffer(chunk, elements));
      continue;
    }
    const absl::StatusOr<const ChunkCoding*> found =
        ChunkCodingFor(chunk.dtype(), chunk.encoding());
    if (!found.ok() || !(*found)->Receives(message.source)) {
      return EncodingRefused(message, chunk);
    }
    const ChunkCoding& coding = **found;
    int64_t length = -1;
    if (coding.expands()) {
      length = message.chunk_length(chunk.key(), chunk.chunk());
      if (length < 0) {
        return absl::OutOfRangeError(absl::StrCat(message.what, " of chunk ", chunk.chunk(),
                                                  " of key ", chunk.key(), ": no such chunk"));
      }
    }
    const absl::StatusOr<int64_t> elements = coding.DecodedElements(chunk.data_bytes(), length);
    if (!elements.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(message.what, " of key ", chunk.key(),
                                                     " chunk ", chunk.chunk(), " ",
                                                     elements.status().message()));
    }
    if (coding.in_place()) {
      chunks.push_back({chunk.key(), chunk.chunk(), frame.pieces(c)});
      continue;
    }
    if (coding.expands()) PS_RETURN_IF_ERROR(count(chunk, *elements));
    if (absl::Status s = coding.Decode(frame.pieces(c), buffer(chunk, *elements)); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(message.what, " of key ", chunk.key(),
                                                     " chunk ", chunk.chunk(), ": ", s.message()));
    }
  }
  return chunks;
}

absl::StatusOr<const ChunkCoding*> PullCodingFor(proto::DType dtype) {
  absl::StatusOr<const ChunkCoding*> coding = ChunkCodingFor(dtype, proto::ENCODING_DENSE);
  if (!coding.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("pull asks for dtype ", dtype, "; F32, F16 and BF16 are served"));
  }
  return coding;
}

absl::StatusOr<std::vector<ParameterServer::ChunkId>> PulledChunkIds(
    const proto::PullRequest& pull, int64_t max_elements,
    const std::function<int64_t(int key, int64_t chunk)>& chunk_length,
    const SharedMemorySegment* shared_memory) {
  int64_t total = 0;
  std::vector<ParameterServer::ChunkId> ids;
  ids.reserve(pull.chunks_size());
  // Each chunk once: an empty tensor's chunk counts no element, and asked
  // for a million times it made one call cost ~300 MB.
  absl::flat_hash_set<std::pair<int, int64_t>> seen;
  for (const proto::ChunkId& id : pull.chunks()) {
    const int64_t length = chunk_length(id.key(), id.chunk());
    if (length < 0) {
      return absl::OutOfRangeError(
          absl::StrCat("chunk ", id.chunk(), " of key ", id.key(), " out of range"));
    }
    if (!seen.insert({id.key(), id.chunk()}).second) {
      return absl::InvalidArgumentError(absl::StrCat("chunk ", id.chunk(), " of key ", id.key(),
                                                     " asked for twice in one pull"));
    }
    if (shared_memory != nullptr) {
      const int64_t offset = pull.shm_offsets(static_cast<int>(ids.size()));
      PS_RETURN_IF_ERROR(CheckPullTarget(*shared_memory, id, offset, length));
    }
    total += length;
    if (total > max_elements) {
      return absl::InvalidArgumentError(absl::StrCat("pull asks for more than ", max_elements,
                                                     " elements in one message; split it"));
    }
    ids.push_back({id.key(), id.chunk()});
  }
  return ids;
}

absl::StatusOr<std::vector<grpc::Slice>> EncodePulledChunks(
    const proto::PullRequest& pull, absl::Span<const ParameterServer::ChunkId> ids,
    const ParameterServer::ChunkViews& views, const SharedMemorySegment* shared_memory,
    proto::PullReply* header) {
  PS_ASSIGN_OR_RETURN(const ChunkCoding* coding, PullCodingFor(pull.dtype()));
  std::vector<grpc::Slice> data;
  data.reserve(ids.size());
  for (size_t c = 0; c < ids.size(); ++c) {
    proto::TensorChunk* chunk = header->add_chunks();
    chunk->set_key(ids[c].key);
    chunk->set_chunk(ids[c].chunk);
    if (shared_memory != nullptr) {
      // Into the worker's memory (PulledChunkIds checked the range).
      WriteToSharedMemory(views.chunks[c], pull.shm_offsets(static_cast<int>(c)), *shared_memory,
                          chunk);
      continue;
    }
    const absl::Span<const float> previous =
        views.previous.empty() ? absl::Span<const float>() : views.previous[c];
    data.push_back(EncodePulledChunk(*coding, views.chunks[c], previous, views.keep_alive, chunk));
  }
  return data;
}

grpc::Slice EncodePulledChunk(const ChunkCoding& coding, absl::Span<const float> values,
                              absl::Span<const float> previous,
                              const std::shared_ptr<const void>& keep_alive,
                              proto::TensorChunk* chunk) {
  if (coding.dtype() == proto::DTYPE_F32 && !previous.empty()) {
    const ChunkCoding& delta = **ChunkCodingFor(proto::DTYPE_F32, proto::ENCODING_DELTA);
    if (const std::optional<int64_t> bytes = delta.EncodedBytes(values, previous)) {
      grpc::Slice pairs(static_cast<size_t>(*bytes));
      delta.Encode(values, previous, const_cast<uint8_t*>(pairs.begin()));
      chunk->set_dtype(proto::DTYPE_F32);
      chunk->set_encoding(proto::ENCODING_DELTA);
      chunk->set_data_bytes(*bytes);
      return pairs;
    }
  }
  const int64_t bytes = *coding.EncodedBytes(values, {});
  chunk->set_dtype(coding.dtype());
  chunk->set_data_bytes(bytes);
  if (coding.in_place()) {
    // The slice keeps the viewed values alive, and unchanged, until gRPC
    // has sent it.
    return proto::BorrowedSlice(values.data(), static_cast<size_t>(bytes), &ReleaseKeepAlive,
                                new std::shared_ptr<const void>(keep_alive));
  }
  // Encoded into a slice of its own (the master weights stay fp32).
  grpc::Slice encoded(static_cast<size_t>(bytes));
  coding.Encode(values, {}, const_cast<uint8_t*>(encoded.begin()));
  return encoded;
}

}  // namespace ps::server
