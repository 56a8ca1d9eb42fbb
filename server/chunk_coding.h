#ifndef PS_SERVER_CHUNK_CODING_H_
#define PS_SERVER_CHUNK_CODING_H_

// How chunk data travels between workers and this server: one registry of
// codings keyed by the wire encoding (a TensorChunk's dtype and encoding,
// proto/parameter_server.proto) that serves both directions. The server
// keeps fp32 master weights: it decodes every received chunk into fp32
// before the domain checks and sums it, and encodes each pulled chunk as
// its pull asks. Element codecs are common/wire_codec.h's.
//
//   coding  wire (dtype, encoding)  bytes on the wire          received in     sent in
//   f32     F32, DENSE              4 per element              pushes, initial pull replies
//   f16     F16, DENSE              2 per element              pushes          pull replies
//   bf16    BF16, DENSE             2 per element              pushes          pull replies
//   topk    F32, TOPK               8 per (index, value) pair  pushes          -
//   delta   F32, DELTA              8 per changed element      -               pull replies
//
// f32 is read in place from the received message and sent from the
// parameters viewed, copying nothing; the others go through buffers.
// Every refusal of received data is kInvalidArgument (kOutOfRange for a
// chunk that does not exist) naming the message, the key, the chunk and
// the problem: malformed input never crashes the server.
//
// Codings are stateless and thread-safe.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include <grpcpp/support/slice.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/shared_memory.h"
#include "proto/parameter_server.pb.h"
#include "proto/wire_format.h"
#include "server/parameter_server.h"

namespace ps::server {

// Which message carried a received chunk.
enum class ChunkSource { kInitialValues, kPush };

class ChunkCoding {
 public:
  virtual ~ChunkCoding() = default;

  // "f32", "f16", "bf16", "topk" or "delta" (the table above).
  virtual absl::string_view name() const = 0;
  virtual proto::DType dtype() const = 0;
  virtual proto::Encoding encoding() const = 0;

  // Receiving.
  // Whether chunks in this coding may arrive in a message from `source`.
  virtual bool Receives(ChunkSource source) const = 0;
  // Whether received bytes are the fp32 values themselves, handed to the
  // domain in place (no buffer, no Decode).
  virtual bool in_place() const { return false; }
  // Whether a received chunk decodes into its chunk's whole length rather
  // than a fixed ratio of its bytes (top-k): such chunks count against a
  // message's bound on decoded elements before their buffer is allocated.
  virtual bool expands() const { return false; }
  // Elements a received chunk of `data_bytes` decodes into, for a chunk of
  // `chunk_length` elements; kInvalidArgument when the bytes cannot be this
  // coding's (not whole elements).
  virtual absl::StatusOr<int64_t> DecodedElements(int64_t data_bytes,
                                                  int64_t chunk_length) const = 0;
  // Decodes a received chunk's bytes (consecutive pieces, any alignment)
  // into `out`, DecodedElements of them; kInvalidArgument naming the
  // problem (for top-k: an index out of range or order, a non-finite value).
  virtual absl::Status Decode(absl::Span<const absl::string_view> pieces,
                              absl::Span<float> out) const = 0;

  // Sending.
  // Bytes `values` take in this coding for a receiver that holds
  // `previous` (the chunk's version - 1; empty when unknown), or nothing
  // when this coding does not carry them (delta: no previous, or no
  // smaller than f32).
  virtual std::optional<int64_t> EncodedBytes(absl::Span<const float> values,
                                              absl::Span<const float> previous) const = 0;
  // Writes them, EncodedBytes of them, to `out`.
  virtual void Encode(absl::Span<const float> values, absl::Span<const float> previous,
                      void* out) const = 0;
};

// The coding of chunks in (dtype, encoding); kInvalidArgument naming the
// pair for one no coding serves.
absl::StatusOr<const ChunkCoding*> ChunkCodingFor(proto::DType dtype, proto::Encoding encoding);

// What a received message's chunks are decoded against.
struct ReceivedChunks {
  ChunkSource source = ChunkSource::kPush;
  // Names the message in refusals ("push", "initial value").
  const char* what = "push";
  // The most elements one message may decode or copy into buffers of its
  // own (the server's chunk_elements; a worker's messages never carry more).
  int64_t max_decoded_elements = 0;
  // Elements of chunk `chunk` of key `key`; -1 when there is none.
  std::function<int64_t(int key, int64_t chunk)> chunk_length;
  // The shared memory of the call's session (null: none), where chunks
  // marked in_shared_memory lie (server/shared_memory_sessions.h).
  const SharedMemorySegment* shared_memory = nullptr;
};

// Buffers of decoded chunks; they must outlive the ChunkBytes pointing at
// them, and so must the frame.
struct DecodedChunks {
  std::vector<std::vector<float>> values;  // one per decoded chunk
  std::vector<absl::string_view> pieces;   // one per decoded chunk, over `values`
};

// The chunks of a received frame's header as fp32 data for the domain
// (ParameterServer::ChunkBytes), in header order: f32 chunks over the
// frame's pieces, read in place; chunks in shared memory copied out of it;
// the others decoded into `decoded`. All are checked before any buffer is
// allocated for the next: a header naming one top-k chunk a million times
// is refused at the bound, not after allocating terabytes.
absl::StatusOr<std::vector<ParameterServer::ChunkBytes>> DecodeReceivedChunks(
    const ReceivedChunks& message,
    const google::protobuf::RepeatedPtrField<proto::TensorChunk>& header_chunks,
    const proto::FrameReader& frame, DecodedChunks* decoded);

// The coding a pull asking for `dtype` is answered in (f32, f16 or bf16);
// kInvalidArgument naming the dtype otherwise.
absl::StatusOr<const ChunkCoding*> PullCodingFor(proto::DType dtype);

// The chunks a pull asks for, checked before it waits or takes views:
// each exists (kOutOfRange otherwise), is asked for once, and all of them
// fit one reply of `max_elements` (the server's chunk_elements); with
// `shared_memory` (a pull into it, CheckPullIntoSharedMemory passed), each
// fits at its offset. kInvalidArgument naming the chunk otherwise.
absl::StatusOr<std::vector<ParameterServer::ChunkId>> PulledChunkIds(
    const proto::PullRequest& pull, int64_t max_elements,
    const std::function<int64_t(int key, int64_t chunk)>& chunk_length,
    const SharedMemorySegment* shared_memory);

// A pull reply's chunks (`ids`, as PullChunkViews viewed them) into
// `header`, returning their data slices: written into `shared_memory` at
// the pull's offsets (a pull into it; no slice), or encoded as the pull
// asks (EncodePulledChunk). kInvalidArgument for a dtype no coding sends.
absl::StatusOr<std::vector<grpc::Slice>> EncodePulledChunks(
    const proto::PullRequest& pull, absl::Span<const ParameterServer::ChunkId> ids,
    const ParameterServer::ChunkViews& views, const SharedMemorySegment* shared_memory,
    proto::PullReply* header);

// One pulled chunk's `values` as a reply slice, described in `chunk`
// (dtype, encoding, data_bytes): in `coding`, or as a delta from
// `previous` (which the worker holds; empty when unknown) where that is
// smaller. An f32 slice borrows `values`, and holds `keep_alive` (which
// keeps them alive and unchanged) until gRPC has sent it.
grpc::Slice EncodePulledChunk(const ChunkCoding& coding, absl::Span<const float> values,
                              absl::Span<const float> previous,
                              const std::shared_ptr<const void>& keep_alive,
                              proto::TensorChunk* chunk);

}  // namespace ps::server

#endif  // PS_SERVER_CHUNK_CODING_H_
