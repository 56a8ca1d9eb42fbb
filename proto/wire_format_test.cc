#include "proto/wire_format.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::proto {
namespace {

using ::testing::HasSubstr;

// All bytes of `buffer`, and the same bytes re-cut into slices of `cut`
// bytes, as a receiver may get them.
std::string Bytes(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

grpc::ByteBuffer Recut(const std::string& bytes, size_t cut) {
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < bytes.size(); at += cut) {
    slices.emplace_back(bytes.data() + at, std::min(cut, bytes.size() - at));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::string Join(absl::Span<const absl::string_view> pieces) {
  std::string out;
  for (absl::string_view p : pieces) out.append(p.data(), p.size());
  return out;
}

PushRequest Header(const std::vector<int64_t>& sizes) {
  PushRequest header;
  header.set_rank(1);
  header.set_iteration(7);
  for (size_t c = 0; c < sizes.size(); ++c) {
    TensorChunk* chunk = header.add_chunks();
    chunk->set_key(static_cast<int>(c));
    chunk->set_data_bytes(sizes[c]);
  }
  return header;
}

TEST(WireFormatTest, FramesRoundTripWhateverTheSlices) {
  const std::string a = "0123456789ab", b = "", c = "XYZW";
  const grpc::Slice data[] = {grpc::Slice(a), grpc::Slice(b), grpc::Slice(c)};
  const std::string bytes = Bytes(MakeFrame(Header({12, 0, 4}), data));
  for (size_t cut = 1; cut <= bytes.size(); ++cut) {
    PushRequest header;
    auto reader = FrameReader::Open(Recut(bytes, cut), "push", &header);
    ASSERT_TRUE(reader.ok()) << reader.status();
    EXPECT_EQ(header.rank(), 1);
    EXPECT_EQ(header.iteration(), 7);
    EXPECT_EQ(reader->data_bytes(), 16);
    ASSERT_TRUE(reader->Split(header.chunks()).ok());
    EXPECT_EQ(Join(reader->pieces(0)), a) << "slices of " << cut;
    EXPECT_EQ(Join(reader->pieces(1)), b);
    EXPECT_EQ(Join(reader->pieces(2)), c);
  }
}

TEST(WireFormatTest, ChunksInSharedMemoryTakeNoFrameBytes) {
  // A 1 MB chunk in shared memory between two framed ones: the frame holds
  // only theirs, and the shared one's pieces are empty.
  PushRequest sent = Header({3, 1 << 20, 2});
  sent.mutable_chunks(1)->set_in_shared_memory(true);
  sent.mutable_chunks(1)->set_shm_offset(4096);
  const grpc::Slice data[] = {grpc::Slice(std::string("abc")), grpc::Slice(std::string("de"))};
  PushRequest header;
  auto reader = FrameReader::Open(MakeFrame(sent, data), "push", &header);
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_TRUE(reader->Split(header.chunks()).ok());
  EXPECT_EQ(Join(reader->pieces(0)), "abc");
  EXPECT_TRUE(reader->pieces(1).empty());
  EXPECT_EQ(Join(reader->pieces(2)), "de");
  // A shared chunk still may not announce a negative size.
  sent.mutable_chunks(1)->set_data_bytes(-4);
  reader = FrameReader::Open(MakeFrame(sent, data), "push", &header);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(reader->Split(header.chunks()).code(), absl::StatusCode::kInvalidArgument);
}

TEST(WireFormatTest, BorrowedSlicesAreNotCopiedAndReleasedOnce) {
  std::string tensor = "abcdefgh";
  int released = 0;
  {
    const grpc::Slice data[] = {BorrowedSlice(
        tensor.data(), tensor.size(), +[](void* count) { ++*static_cast<int*>(count); },
        &released)};
    EXPECT_EQ(reinterpret_cast<const char*>(data[0].begin()), tensor.data());
    grpc::ByteBuffer frame = MakeFrame(Header({8}), data);
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(frame.Dump(&slices).ok());
    EXPECT_EQ(reinterpret_cast<const char*>(slices.back().begin()), tensor.data());
    EXPECT_EQ(released, 0);
  }
  EXPECT_EQ(released, 1);
}

TEST(WireFormatTest, MalformedFramesAreInvalidArgumentsThatSayWhy) {
  const std::string data(8, 'd');
  const grpc::Slice slices[] = {grpc::Slice(data)};
  const std::string good = Bytes(MakeFrame(Header({8}), slices));
  struct Case {
    const char* what;
    std::string bytes;
    const char* message;
  };
  const std::string header_length_past_end = std::string("\xff\x00\x00\x00", 4) + "abc";
  const std::string garbage = std::string("\x03\x00\x00\x00", 4) + "\xff\xff\xff";
  const std::vector<Case> cases = {
      {"empty", "", "0 bytes, shorter than the 4-byte header length"},
      {"short prefix", "ab", "shorter than the 4-byte header length"},
      {"header length past the end", header_length_past_end,
       "a header of 255 bytes runs past the end of a 7-byte message"},
      {"garbage header", garbage, "header is not a parsable message"},
      {"truncated data", good.substr(0, good.size() - 1), "announces 8 bytes but only 7 follow"},
      {"trailing bytes", good + "zz", "2 bytes follow the data its header announces"},
  };
  for (const Case& c : cases) {
    PushRequest header;
    absl::Status s;
    auto reader = FrameReader::Open(Recut(c.bytes, 3), "push", &header);
    s = reader.ok() ? reader->Split(header.chunks()) : reader.status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message)) << c.what;
    EXPECT_THAT(std::string(s.message()), HasSubstr("malformed push")) << c.what;
  }
  // A header whose chunk carries its data inside, or a negative size.
  PushRequest inside = Header({0});
  inside.mutable_chunks(0)->set_data("abcd");
  PushRequest negative = Header({-4});
  for (const PushRequest* bad : {&inside, &negative}) {
    PushRequest header;
    auto reader = FrameReader::Open(MakeFrame(*bad, {}), "push", &header);
    ASSERT_TRUE(reader.ok());
    EXPECT_EQ(reader->Split(header.chunks()).code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(WireFormatTest, SmallMessagesRoundTrip) {
  PullRequest request;
  request.set_version(3);
  request.add_chunks()->set_key(2);
  PullRequest back;
  ASSERT_TRUE(ParseMessage(SerializeMessage(request), "pull request", &back).ok());
  EXPECT_EQ(back.version(), 3);
  EXPECT_EQ(back.chunks(0).key(), 2);
  EXPECT_EQ(ParseMessage(Recut("\xff\xff", 1), "pull request", &back).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ps::proto
