#include "proto/wire_format.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ps::proto {

grpc::ByteBuffer MakeFrame(const google::protobuf::MessageLite& header,
                           absl::Span<const grpc::Slice> data) {
  const size_t header_bytes = header.ByteSizeLong();
  grpc::Slice head(kFrameLengthBytes + header_bytes);
  uint8_t* out = const_cast<uint8_t*>(head.begin());
  const uint32_t length = static_cast<uint32_t>(header_bytes);
  for (size_t i = 0; i < kFrameLengthBytes; ++i) out[i] = static_cast<uint8_t>(length >> (8 * i));
  header.SerializeWithCachedSizesToArray(out + kFrameLengthBytes);
  std::vector<grpc::Slice> slices;
  slices.reserve(1 + data.size());
  slices.push_back(std::move(head));
  for (const grpc::Slice& slice : data) slices.push_back(slice);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

grpc::Slice BorrowedSlice(const void* bytes, size_t size, void (*release)(void*), void* arg) {
  // gRPC only reads a slice it sends; the cast is for the constructor.
  return grpc::Slice(const_cast<void*>(bytes), size, release, arg);
}

grpc::ByteBuffer SerializeMessage(const google::protobuf::MessageLite& message) {
  grpc::Slice slice(message.ByteSizeLong());
  message.SerializeWithCachedSizesToArray(const_cast<uint8_t*>(slice.begin()));
  return grpc::ByteBuffer(&slice, 1);
}

absl::Status ParseMessage(const grpc::ByteBuffer& buffer, const char* what,
                          google::protobuf::MessageLite* message) {
  std::vector<grpc::Slice> slices;
  // An unreadable buffer is no message, not an empty (all-default) one.
  if (!buffer.Valid() || !buffer.Dump(&slices).ok()) {
    return absl::InvalidArgumentError(absl::StrCat("malformed ", what, ": unreadable message"));
  }
  std::string bytes;
  for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  if (!message->ParseFromString(bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("malformed ", what, ": not a parsable message"));
  }
  return absl::OkStatus();
}

absl::StatusOr<FrameReader> FrameReader::Open(const grpc::ByteBuffer& buffer, const char* what,
                                              google::protobuf::MessageLite* header) {
  FrameReader reader;
  reader.what_ = what;
  if (buffer.Valid() && !buffer.Dump(&reader.slices_).ok()) reader.slices_.clear();
  int64_t total = 0;
  for (const grpc::Slice& s : reader.slices_) total += static_cast<int64_t>(s.size());
  // Reads `n` bytes at the cursor into `out` (the prefix and the header are
  // small: copying them is cheaper than parsing across slices).
  size_t slice = 0, offset = 0;
  auto read = [&](size_t n, char* out) {
    while (n > 0) {
      const grpc::Slice& s = reader.slices_[slice];
      const size_t take = std::min(n, s.size() - offset);
      std::memcpy(out, s.begin() + offset, take);
      out += take;
      n -= take;
      offset += take;
      if (offset == s.size()) {
        ++slice;
        offset = 0;
      }
    }
  };
  // Skip empty slices so the cursor always points at a byte, if any is left.
  auto settle = [&] {
    while (slice < reader.slices_.size() && offset == reader.slices_[slice].size()) {
      ++slice;
      offset = 0;
    }
  };
  settle();
  if (total < static_cast<int64_t>(kFrameLengthBytes)) {
    return absl::InvalidArgumentError(absl::StrCat("malformed ", what, ": ", total,
                                                   " bytes, shorter than the ", kFrameLengthBytes,
                                                   "-byte header length"));
  }
  unsigned char prefix[kFrameLengthBytes];
  read(kFrameLengthBytes, reinterpret_cast<char*>(prefix));
  uint32_t header_bytes = 0;
  for (size_t i = 0; i < kFrameLengthBytes; ++i) header_bytes |= uint32_t{prefix[i]} << (8 * i);
  const int64_t rest = total - static_cast<int64_t>(kFrameLengthBytes);
  if (header_bytes > rest) {
    return absl::InvalidArgumentError(absl::StrCat("malformed ", what, ": a header of ",
                                                   header_bytes, " bytes runs past the end of a ",
                                                   total, "-byte message"));
  }
  std::string bytes(header_bytes, '\0');
  settle();
  read(header_bytes, bytes.data());
  if (!header->ParseFromString(bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed ", what, ": its header is not a parsable message"));
  }
  settle();
  reader.data_slice_ = slice;
  reader.data_offset_ = offset;
  reader.data_bytes_ = rest - header_bytes;
  return reader;
}

absl::Status FrameReader::Split(const google::protobuf::RepeatedPtrField<TensorChunk>& chunks) {
  pieces_.clear();
  first_piece_.assign(1, 0);
  size_t slice = data_slice_, offset = data_offset_;
  int64_t left = data_bytes_;
  for (const TensorChunk& chunk : chunks) {
    if (!chunk.data().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "malformed ", what_, ": key ", chunk.key(), " chunk ", chunk.chunk(),
          " carries data inside the header; a chunk's bytes follow the header"));
    }
    // A chunk in shared memory has no bytes in the frame (its range is
    // the service's to check).
    const int64_t need_bytes = chunk.in_shared_memory() ? 0 : chunk.data_bytes();
    if (chunk.data_bytes() < 0 || need_bytes > left) {
      return absl::InvalidArgumentError(absl::StrCat(
          "malformed ", what_, ": key ", chunk.key(), " chunk ", chunk.chunk(), " announces ",
          chunk.data_bytes(), " bytes but only ", left,
          " follow (truncated message, or a wrong size in the header)"));
    }
    int64_t need = need_bytes;
    left -= need;
    while (need > 0) {
      const grpc::Slice& s = slices_[slice];
      const size_t take = static_cast<size_t>(std::min<int64_t>(need, s.size() - offset));
      pieces_.emplace_back(reinterpret_cast<const char*>(s.begin()) + offset, take);
      need -= static_cast<int64_t>(take);
      offset += take;
      if (offset == s.size()) {
        ++slice;
        offset = 0;
      }
    }
    first_piece_.push_back(pieces_.size());
  }
  if (left != 0) {
    return absl::InvalidArgumentError(absl::StrCat("malformed ", what_, ": ", left,
                                                   " bytes follow the data its header announces"));
  }
  return absl::OkStatus();
}

}  // namespace ps::proto
