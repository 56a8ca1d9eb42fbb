#include "server/chunk_coding.h"

#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/wire_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kChunkLength = 4;  // every chunk of the fake model

// A received frame: `chunks` headers (dtype, encoding, data_bytes set)
// with `data` behind them, read back as a server reads it.
struct Received {
  proto::PushRequest header;
  std::unique_ptr<proto::FrameReader> frame;
  DecodedChunks decoded;
};
std::unique_ptr<Received> Receive(std::vector<proto::TensorChunk> chunks, const std::string& data) {
  auto received = std::make_unique<Received>();
  proto::PushRequest request;
  for (proto::TensorChunk& chunk : chunks) *request.add_chunks() = chunk;
  const grpc::ByteBuffer buffer = proto::MakeFrame(request, {grpc::Slice(data)});
  auto frame = proto::FrameReader::Open(buffer, "push", &received->header);
  EXPECT_TRUE(frame.ok()) << frame.status();
  received->frame = std::make_unique<proto::FrameReader>(*std::move(frame));
  EXPECT_TRUE(received->frame->Split(received->header.chunks()).ok());
  return received;
}

proto::TensorChunk Chunk(int key, proto::DType dtype, int64_t bytes,
                         proto::Encoding encoding = proto::ENCODING_DENSE) {
  proto::TensorChunk chunk;
  chunk.set_key(key);
  chunk.set_dtype(dtype);
  chunk.set_encoding(encoding);
  chunk.set_data_bytes(bytes);
  return chunk;
}

std::string Bytes(const void* p, size_t n) { return std::string(static_cast<const char*>(p), n); }
std::string F32(std::vector<float> v) { return Bytes(v.data(), v.size() * 4); }
std::string Pairs(std::vector<std::pair<uint32_t, float>> pairs) {
  std::string out;
  for (auto [index, value] : pairs) out += Bytes(&index, 4) + Bytes(&value, 4);
  return out;
}

ReceivedChunks Message(ChunkSource source, int64_t max_decoded = 100) {
  return {.source = source,
          .what = source == ChunkSource::kPush ? "push" : "initial value",
          .max_decoded_elements = max_decoded,
          .chunk_length = [](int key, int64_t chunk) {
            return key < 3 && chunk == 0 ? kChunkLength : -1;
          }};
}

// The fp32 values of a decoded chunk (its pieces concatenated).
std::vector<float> Values(const ParameterServer::ChunkBytes& chunk) {
  std::string bytes;
  for (absl::string_view piece : chunk.pieces) bytes += std::string(piece);
  std::vector<float> values(bytes.size() / 4);
  std::memcpy(values.data(), bytes.data(), bytes.size());
  return values;
}

TEST(ChunkCodingTest, TheRegistryServesEachWireEncodingAndRefusesOthers) {
  struct Known {
    proto::DType dtype;
    proto::Encoding encoding;
    const char* name;
  };
  for (const Known& k : {Known{proto::DTYPE_F32, proto::ENCODING_DENSE, "f32"},
                         Known{proto::DTYPE_F16, proto::ENCODING_DENSE, "f16"},
                         Known{proto::DTYPE_BF16, proto::ENCODING_DENSE, "bf16"},
                         Known{proto::DTYPE_F32, proto::ENCODING_TOPK, "topk"},
                         Known{proto::DTYPE_F32, proto::ENCODING_DELTA, "delta"}}) {
    absl::StatusOr<const ChunkCoding*> coding = ChunkCodingFor(k.dtype, k.encoding);
    ASSERT_TRUE(coding.ok()) << k.name;
    EXPECT_EQ((*coding)->name(), k.name);
    EXPECT_EQ((*coding)->dtype(), k.dtype);
    EXPECT_EQ((*coding)->encoding(), k.encoding);
  }
  absl::StatusOr<const ChunkCoding*> none = ChunkCodingFor(proto::DTYPE_F16, proto::ENCODING_TOPK);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(none.status().message(), HasSubstr("no coding for dtype 1 and encoding 1"));
  EXPECT_FALSE(ChunkCodingFor(static_cast<proto::DType>(9), proto::ENCODING_DENSE).ok());
  EXPECT_THAT(PullCodingFor(proto::DTYPE_BF16).value()->name(), "bf16");
  EXPECT_THAT(PullCodingFor(static_cast<proto::DType>(7)).status().message(),
              HasSubstr("pull asks for dtype 7; F32, F16 and BF16 are served"));
}

TEST(ChunkCodingTest, PushesDecodeEveryCodingIntoF32InHeaderOrder) {
  const std::vector<float> dense = {1.f, -2.f, 0.5f, 4.f};
  std::string half(8, '\0');
  (*WireCodecForDType(DType::kF16))->Encode(dense, half.data());
  std::string brain(8, '\0');
  (*WireCodecForDType(DType::kBF16))->Encode(dense, brain.data());
  const std::string topk = Pairs({{1, 3.f}, {3, -1.f}});
  std::unique_ptr<Received> r = Receive(
      {Chunk(0, proto::DTYPE_F32, 16), Chunk(1, proto::DTYPE_F16, 8),
       Chunk(2, proto::DTYPE_BF16, 8), Chunk(1, proto::DTYPE_F32, 16, proto::ENCODING_TOPK)},
      F32(dense) + half + brain + topk);
  absl::StatusOr<std::vector<ParameterServer::ChunkBytes>> chunks = DecodeReceivedChunks(
      Message(ChunkSource::kPush), r->header.chunks(), *r->frame, &r->decoded);
  ASSERT_TRUE(chunks.ok()) << chunks.status();
  ASSERT_EQ(chunks->size(), 4u);
  EXPECT_EQ((*chunks)[3].key, 1);
  EXPECT_EQ(Values((*chunks)[0]), dense);
  EXPECT_EQ(Values((*chunks)[1]), dense);  // exact in fp16 and bf16
  EXPECT_EQ(Values((*chunks)[2]), dense);
  EXPECT_THAT(Values((*chunks)[3]), ElementsAre(0.f, 3.f, 0.f, -1.f));
  // f32 is read in place: no buffer of its own.
  EXPECT_EQ(r->decoded.values.size(), 3u);
}

// The refusal of one chunk of a push (or of initial values).
std::string Refusal(ChunkSource source, proto::TensorChunk chunk, const std::string& data,
                    absl::StatusCode code = absl::StatusCode::kInvalidArgument,
                    int64_t max_decoded = 100) {
  std::unique_ptr<Received> r = Receive({chunk}, data);
  absl::StatusOr<std::vector<ParameterServer::ChunkBytes>> chunks = DecodeReceivedChunks(
      Message(source, max_decoded), r->header.chunks(), *r->frame, &r->decoded);
  EXPECT_EQ(chunks.status().code(), code) << chunks.status();
  return std::string(chunks.status().message());
}

TEST(ChunkCodingTest, MalformedReceivedChunksAreRefusedNamingTheProblem) {
  using S = ChunkSource;
  EXPECT_THAT(Refusal(S::kPush, Chunk(0, proto::DTYPE_F32, 6), std::string(6, 'x')),
              HasSubstr("push of key 0 chunk 0 carries 6 bytes, not a whole number of F32"));
  EXPECT_THAT(Refusal(S::kPush, Chunk(0, proto::DTYPE_F16, 3), std::string(3, 'x')),
              HasSubstr("carries 3 bytes, not a whole number of fp16 elements"));
  EXPECT_THAT(Refusal(S::kInitialValues, Chunk(0, proto::DTYPE_F16, 4), std::string(4, 'x')),
              HasSubstr("initial value of key 0 has dtype 1; only F32 are supported here"));
  EXPECT_THAT(Refusal(S::kPush, Chunk(0, static_cast<proto::DType>(9), 4), std::string(4, 'x')),
              HasSubstr("has dtype 9; only F32, F16 and BF16 are supported here"));
  EXPECT_THAT(Refusal(S::kInitialValues, Chunk(0, proto::DTYPE_F32, 8, proto::ENCODING_TOPK),
                      Pairs({{0, 1.f}})),
              HasSubstr("has encoding 1 and dtype 0; pushes may be top-k pairs of F32 values"));
  EXPECT_THAT(Refusal(S::kPush, Chunk(0, proto::DTYPE_F32, 8, proto::ENCODING_DELTA),
                      Pairs({{0, 1.f}})),
              HasSubstr("nothing else sparse"));
  EXPECT_THAT(Refusal(S::kPush, Chunk(0, proto::DTYPE_BF16, 8, proto::ENCODING_TOPK),
                      Pairs({{0, 1.f}})),
              HasSubstr("nothing else sparse"));
  // Top-k pairs: the chunk must exist, indices in range and ascending,
  // values finite, bytes whole pairs.
  EXPECT_THAT(Refusal(S::kPush, Chunk(7, proto::DTYPE_F32, 8, proto::ENCODING_TOPK),
                      Pairs({{0, 1.f}}), absl::StatusCode::kOutOfRange),
              HasSubstr("push of chunk 0 of key 7: no such chunk"));
  EXPECT_THAT(Refusal(S::kPush, Chunk(0, proto::DTYPE_F32, 8, proto::ENCODING_TOPK),
                      Pairs({{4, 1.f}})),
              HasSubstr("push of key 0 chunk 0: "));
  EXPECT_FALSE(Refusal(S::kPush, Chunk(0, proto::DTYPE_F32, 16, proto::ENCODING_TOPK),
                       Pairs({{2, 1.f}, {1, 1.f}}))
                   .empty());
  EXPECT_FALSE(Refusal(S::kPush, Chunk(0, proto::DTYPE_F32, 8, proto::ENCODING_TOPK),
                       Pairs({{0, std::numeric_limits<float>::infinity()}}))
                   .empty());
  EXPECT_FALSE(Refusal(S::kPush, Chunk(0, proto::DTYPE_F32, 5, proto::ENCODING_TOPK),
                       std::string(5, 'x'))
                   .empty());
  // Shared memory without a segment.
  proto::TensorChunk shm = Chunk(0, proto::DTYPE_F32, 16);
  shm.set_in_shared_memory(true);
  EXPECT_THAT(Refusal(S::kPush, shm, ""), HasSubstr("this session has none attached"));
}

TEST(ChunkCodingTest, TopKChunksCountAgainstTheMessagesBoundBeforeTheirBufferIsMade) {
  // Each decodes into its chunk's 4 elements: two fit a bound of 8, a
  // third does not, however few bytes it carries.
  const proto::TensorChunk topk = Chunk(0, proto::DTYPE_F32, 8, proto::ENCODING_TOPK);
  const std::string pair = Pairs({{0, 1.f}});
  std::unique_ptr<Received> r = Receive({topk, topk, topk}, pair + pair + pair);
  absl::StatusOr<std::vector<ParameterServer::ChunkBytes>> chunks = DecodeReceivedChunks(
      Message(ChunkSource::kPush, /*max_decoded=*/8), r->header.chunks(), *r->frame, &r->decoded);
  EXPECT_EQ(chunks.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(chunks.status().message(),
              HasSubstr("push decodes to more than 8 elements in one message (at key 0 chunk 0)"));
  EXPECT_EQ(r->decoded.values.size(), 2u);
}

TEST(ChunkCodingTest, PulledChunksAreEncodedAsAskedAndAsDeltasWhereSmaller) {
  const std::vector<float> now = {1.f, 2.f, 3.f, 4.f, 5.f};
  auto keep_alive = std::make_shared<int>(0);
  const ChunkCoding& f32 = **PullCodingFor(proto::DTYPE_F32);
  // Dense f32 borrows the values.
  proto::TensorChunk chunk;
  grpc::Slice slice = EncodePulledChunk(f32, now, {}, keep_alive, &chunk);
  EXPECT_EQ(slice.begin(), reinterpret_cast<const uint8_t*>(now.data()));
  EXPECT_EQ(chunk.data_bytes(), 20);
  EXPECT_EQ(chunk.encoding(), proto::ENCODING_DENSE);
  EXPECT_EQ(keep_alive.use_count(), 2);  // until the slice goes
  slice = grpc::Slice();
  EXPECT_EQ(keep_alive.use_count(), 1);
  // Two of five changed: a delta of two pairs.
  const std::vector<float> before = {1.f, 0.f, 3.f, 0.f, 5.f};
  chunk.Clear();
  slice = EncodePulledChunk(f32, now, before, keep_alive, &chunk);
  EXPECT_EQ(chunk.encoding(), proto::ENCODING_DELTA);
  EXPECT_EQ(chunk.data_bytes(), 16);
  std::vector<float> applied = before;
  const absl::string_view bytes(reinterpret_cast<const char*>(slice.begin()), slice.size());
  ASSERT_TRUE(ApplyDelta({bytes}, absl::MakeSpan(applied)).ok());
  EXPECT_EQ(applied, now);
  // Three of five changed: dense is smaller.
  chunk.Clear();
  EncodePulledChunk(f32, now, {0.f, 0.f, 0.f, 4.f, 5.f}, keep_alive, &chunk);
  EXPECT_EQ(chunk.encoding(), proto::ENCODING_DENSE);
  EXPECT_EQ(chunk.data_bytes(), 20);
  // fp16 into a slice of its own, 2 bytes an element.
  chunk.Clear();
  slice = EncodePulledChunk(**PullCodingFor(proto::DTYPE_F16), now, {}, keep_alive, &chunk);
  EXPECT_EQ(chunk.dtype(), proto::DTYPE_F16);
  EXPECT_EQ(chunk.data_bytes(), 10);
  std::vector<float> decoded(5);
  const absl::string_view half(reinterpret_cast<const char*>(slice.begin()), slice.size());
  ASSERT_TRUE((*WireCodecForDType(DType::kF16))->Decode({half}, absl::MakeSpan(decoded)).ok());
  EXPECT_EQ(decoded, now);
}

TEST(ChunkCodingTest, APullsChunksMustExistComeOnceAndFitOneReply) {
  const auto lengths = [](int key, int64_t chunk) { return key < 3 && chunk == 0 ? 4 : -1; };
  proto::PullRequest pull;
  for (int key : {0, 2}) pull.add_chunks()->set_key(key);
  absl::StatusOr<std::vector<ParameterServer::ChunkId>> ids =
      PulledChunkIds(pull, /*max_elements=*/8, lengths, nullptr);
  ASSERT_TRUE(ids.ok()) << ids.status();
  ASSERT_EQ(ids->size(), 2u);
  EXPECT_EQ((*ids)[1].key, 2);
  EXPECT_THAT(PulledChunkIds(pull, 7, lengths, nullptr).status().message(),
              HasSubstr("pull asks for more than 7 elements in one message; split it"));
  pull.add_chunks()->set_key(0);
  EXPECT_THAT(PulledChunkIds(pull, 100, lengths, nullptr).status().message(),
              HasSubstr("chunk 0 of key 0 asked for twice in one pull"));
  pull.mutable_chunks(2)->set_key(5);
  EXPECT_EQ(PulledChunkIds(pull, 100, lengths, nullptr).status().code(),
            absl::StatusCode::kOutOfRange);
  // Into shared memory: each chunk's 16 bytes must fit at its offset.
  auto segment = *SharedMemorySegment::Create(64);
  proto::PullRequest shm;
  shm.add_chunks()->set_key(1);
  shm.add_shm_offsets(48);
  EXPECT_TRUE(PulledChunkIds(shm, 100, lengths, segment.get()).ok());
  shm.set_shm_offsets(0, 49);
  EXPECT_THAT(PulledChunkIds(shm, 100, lengths, segment.get()).status().message(),
              HasSubstr("do not fit in 64"));
}

TEST(ChunkCodingTest, APullReplyDescribesEachChunkInRequestOrder) {
  const std::vector<float> a = {1.f, 2.f}, b = {3.f};
  ParameterServer::ChunkViews views;
  views.version = 3;
  views.keep_alive = std::make_shared<int>(0);
  views.chunks = {a, b};
  const std::vector<ParameterServer::ChunkId> ids = {{4, 1}, {2, 0}};
  proto::PullRequest pull;
  pull.set_dtype(proto::DTYPE_BF16);
  proto::PullReply header;
  absl::StatusOr<std::vector<grpc::Slice>> data =
      EncodePulledChunks(pull, ids, views, nullptr, &header);
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_EQ(header.chunks_size(), 2);
  EXPECT_EQ(header.chunks(0).key(), 4);
  EXPECT_EQ(header.chunks(0).chunk(), 1);
  EXPECT_EQ(header.chunks(1).data_bytes(), 2);
  EXPECT_EQ(header.chunks(1).dtype(), proto::DTYPE_BF16);
  EXPECT_EQ(data->size(), 2u);
  // Into shared memory: no slice, the values at their offsets.
  auto segment = *SharedMemorySegment::Create(64);
  proto::PullRequest shm;
  shm.add_shm_offsets(8);
  shm.add_shm_offsets(0);
  header.Clear();
  data = EncodePulledChunks(shm, ids, views, segment.get(), &header);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_TRUE(data->empty());
  EXPECT_TRUE(header.chunks(0).in_shared_memory());
  float written[3];
  std::memcpy(written, segment->data(), sizeof(written));
  EXPECT_THAT(written, ElementsAre(3.f, 0.f, 1.f));
  pull.set_dtype(static_cast<proto::DType>(8));
  EXPECT_EQ(EncodePulledChunks(pull, ids, views, nullptr, &header).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ps::server
