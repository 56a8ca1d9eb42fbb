#ifndef PS_COMMON_WIRE_CODEC_H_
#define PS_COMMON_WIRE_CODEC_H_

// How tensor data travels between workers and servers (--compression): a
// codec turns a chunk's fp32 values into the bytes of one TensorChunk and
// back. The chunk's dtype and encoding name its codec
// (proto/parameter_server.proto: top-k pairs are F32 with ENCODING_TOPK), so
// a receiver decodes whatever each sender chose; the server keeps fp32
// master weights and decodes every push into fp32 before summing, and
// encodes pulls as each pull asks.
//
//   none  F32, 4 bytes per element, exact
//   fp16  IEEE binary16, 2 bytes: round to nearest even; from 65520 on (what
//         rounds past 65504) is infinity (which the server refuses as
//         non-finite)
//   bf16  bfloat16, 2 bytes: float's range, 8 bits of mantissa
//   topk:F  (pushes only) the largest F fraction of each chunk's values by
//         magnitude, as (uint32 index, f32 value) pairs with the indices
//         strictly ascending: 8 bytes per value sent, ceil(F * n) of them
//         (at least one) for a chunk of n. What is not sent is the sender's
//         to keep: with a residual, Encode adds it to the values first and
//         leaves in it what was not sent (error feedback: 1-bit SGD, DGC),
//         so nothing of the gradient is lost, only delayed.
//
// Codecs are thread-safe and keep no state (a residual is the caller's).

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/dtype.h"

namespace ps {

class WireCodec {
 public:
  virtual ~WireCodec() = default;

  // "none", "fp16", "bf16" or "topk:F": the --compression value.
  virtual absl::string_view name() const = 0;
  // The dtype a chunk in this encoding carries on the wire.
  virtual DType dtype() const = 0;
  // Whether a chunk carries (index, value) pairs rather than every value.
  virtual bool sparse() const { return false; }
  // Bytes `elements` values take on the wire.
  virtual int64_t EncodedBytes(int64_t elements) const = 0;
  // Writes `in` encoded to `out`, EncodedBytes(in.size()) bytes (any
  // alignment). `residual` (empty, or in.size() values) is error feedback:
  // added to `in` before encoding and left holding what the encoding lost
  // (dense codecs: their rounding error).
  virtual void Encode(absl::Span<const float> in, absl::Span<float> residual,
                      void* out) const = 0;
  void Encode(absl::Span<const float> in, void* out) const { Encode(in, {}, out); }
  // Decodes one chunk's bytes, laid out in consecutive `pieces` (a received
  // message's slices: any alignment, an element may straddle two), into
  // `out`. kInvalidArgument, writing nothing, unless they are exactly
  // EncodedBytes(out.size()) bytes (and, sparse, unless every index is below
  // out.size() and strictly above the one before, and every value finite:
  // a sparse chunk's refusal names the problem).
  virtual absl::Status Decode(absl::Span<const absl::string_view> pieces,
                              absl::Span<float> out) const = 0;
};

// The codec named `name` ("" is "none"; "topk:F" with 0 < F <= 1);
// kInvalidArgument naming the known ones for anything else.
absl::StatusOr<std::unique_ptr<WireCodec>> MakeWireCodec(absl::string_view name);

// The codec of a chunk that arrived as `dtype` (F32, F16, BF16);
// kInvalidArgument for a dtype no codec sends.
absl::StatusOr<const WireCodec*> WireCodecForDType(DType dtype);

// Decodes a top-k chunk (pairs as above) of a tensor chunk of out.size()
// elements into `out` (zero where nothing was sent); the checks of
// WireCodec::Decode for a sparse codec. Any k is accepted: the fraction is
// the sender's choice.
absl::Status DecodeTopK(absl::Span<const absl::string_view> pieces, absl::Span<float> out);

// Delta pulls (PullRequest.delta): a chunk sent as the elements that
// changed since the version the receiver holds, as top-k's (index, value)
// pairs. CountChanged counts the elements of `now` whose bits differ from
// `before` (the same size), stopping at `limit`; EncodeChanged writes their
// pairs, ascending (8 bytes each) to `out`; ApplyDelta checks a received
// chunk as DecodeTopK does and writes the listed values into `out`, which
// holds the old version, leaving the rest.
int64_t CountChanged(absl::Span<const float> now, absl::Span<const float> before, int64_t limit);
void EncodeChanged(absl::Span<const float> now, absl::Span<const float> before, void* out);
absl::Status ApplyDelta(absl::Span<const absl::string_view> pieces, absl::Span<float> out);

}  // namespace ps

#endif  // PS_COMMON_WIRE_CODEC_H_
