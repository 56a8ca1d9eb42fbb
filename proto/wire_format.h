#ifndef PS_PROTO_WIRE_FORMAT_H_
#define PS_PROTO_WIRE_FORMAT_H_

// The framing of the messages that carry tensor data (Push and Initialize
// requests, Pull replies; parameter_server.proto's header states the wire):
//
//   [header length: 4 bytes, little-endian uint32]
//   [header: that many bytes, a serialized PushRequest / InitializeRequest /
//    PullReply whose TensorChunks carry data_bytes and no data]
//   [each chunk's data_bytes raw little-endian bytes, in header order]
//
// so tensor bytes go from the sender's buffer onto the wire, and from the
// receive buffers into the destination, without a protobuf `bytes` copy on
// either side. Building a frame references the data slices; reading one
// references the received slices: neither copies tensor bytes.

#include <cstdint>
#include <string>
#include <vector>

#include <google/protobuf/message_lite.h>
#include <google/protobuf/repeated_field.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/parameter_server.pb.h"

namespace ps::proto {

// The methods that carry frames (requests or replies), on the generated
// service's names.
inline constexpr char kInitializeMethod[] = "/ps.proto.ParameterServer/Initialize";
inline constexpr char kPushMethod[] = "/ps.proto.ParameterServer/Push";
inline constexpr char kPullMethod[] = "/ps.proto.ParameterServer/Pull";
// The metadata key of a worker's session credential (RegisterReply.session;
// parameter_server.proto, "Credentials").
inline constexpr char kSessionMetadataKey[] = "ps-session";
// Trailing metadata of a Register refused ALREADY_EXISTS because its worker
// id is live and the registration does not prove it is that worker: the
// refusal ends once the server declares the holder lost, so waiting helps
// (a rank held by another id, the other ALREADY_EXISTS, does not end).
inline constexpr char kRetryRegisterMetadataKey[] = "ps-retry-register";

// Bytes of the header-length prefix.
inline constexpr size_t kFrameLengthBytes = 4;

// A frame: `header` serialized behind its length, then `data` in order. The
// data slices are referenced, not copied (see BorrowedSlice).
grpc::ByteBuffer MakeFrame(const google::protobuf::MessageLite& header,
                           absl::Span<const grpc::Slice> data);

// A slice over `size` bytes at `bytes`, not copied: gRPC reads them in place
// until it drops its last reference, and then calls release(arg), once, on
// one of its threads. The bytes must stay valid and unchanged until then.
grpc::Slice BorrowedSlice(const void* bytes, size_t size, void (*release)(void*), void* arg);

// A small protobuf (e.g. a PullRequest) as a one-slice message, and back.
grpc::ByteBuffer SerializeMessage(const google::protobuf::MessageLite& message);
// kInvalidArgument, naming `what`, when the bytes do not parse.
absl::Status ParseMessage(const grpc::ByteBuffer& buffer, const char* what,
                          google::protobuf::MessageLite* message);

// A received frame, read in place: it holds references to the message's
// slices, so the views it returns live as long as it does.
class FrameReader {
 public:
  // Reads the length prefix and the header. kInvalidArgument, naming
  // `what`, for a message shorter than the prefix, a header that runs past
  // its end, or a header that does not parse into `header`.
  static absl::StatusOr<FrameReader> Open(const grpc::ByteBuffer& buffer, const char* what,
                                          google::protobuf::MessageLite* header);

  // Cuts the data behind the header into one range per chunk of `chunks`
  // (their data_bytes, in order): chunk c's bytes are pieces(c), any number
  // of slices' parts, any alignment. kInvalidArgument when a chunk carries
  // `data` inside the header, announces a negative size, or the data ends
  // before (truncated) or after (trailing bytes) what the header announces.
  absl::Status Split(const google::protobuf::RepeatedPtrField<TensorChunk>& chunks);
  absl::Span<const absl::string_view> pieces(size_t chunk) const {
    return absl::MakeConstSpan(pieces_).subspan(first_piece_[chunk],
                                                first_piece_[chunk + 1] - first_piece_[chunk]);
  }

  // Bytes behind the header.
  int64_t data_bytes() const { return data_bytes_; }

 private:
  FrameReader() = default;

  std::string what_;
  std::vector<grpc::Slice> slices_;
  size_t data_slice_ = 0;   // where the data starts: slice index ...
  size_t data_offset_ = 0;  // ... and byte within it
  int64_t data_bytes_ = 0;
  std::vector<absl::string_view> pieces_;
  std::vector<size_t> first_piece_;  // per chunk, plus one past the last
};

}  // namespace ps::proto

#endif  // PS_PROTO_WIRE_FORMAT_H_
