#include "server/shared_memory_sessions.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kBytes = 4096;

// A segment this process creates, as a worker would, and its offer.
struct Offered {
  std::unique_ptr<SharedMemorySegment> created;
  proto::SharedMemory offer;
};
Offered Offer(int64_t bytes = kBytes) {
  Offered o;
  o.created = *SharedMemorySegment::Create(static_cast<size_t>(bytes));
  o.offer.set_pid(o.created->pid());
  o.offer.set_fd(o.created->fd());
  o.offer.set_data_bytes(bytes);
  o.offer.set_nonce(o.created->nonce());
  return o;
}

TEST(SharedMemorySessionsTest, ASegmentIsBoundToItsSessionAndReplacedByTheRanksNextOne) {
  SharedMemorySessions sessions;
  Offered first = Offer();
  ASSERT_TRUE(sessions.Attach(0, "s1", &first.offer, kBytes).ok());
  const std::shared_ptr<SharedMemorySegment> mapped = sessions.SegmentOf("s1");
  ASSERT_NE(mapped, nullptr);
  EXPECT_EQ(sessions.SegmentOf("other"), nullptr);
  EXPECT_EQ(sessions.SegmentOf(""), nullptr);
  // The server's mapping sees what the worker writes.
  first.created->data()[7] = 42;
  EXPECT_EQ(mapped->data()[7], 42);
  // Rank 0 registers again without memory: its old session has none, and
  // the call in flight keeps its mapping.
  EXPECT_TRUE(sessions.Attach(0, "s2", nullptr, kBytes).ok());
  EXPECT_EQ(sessions.SegmentOf("s1"), nullptr);
  EXPECT_EQ(sessions.SegmentOf("s2"), nullptr);
  EXPECT_EQ(mapped->data()[7], 42);
}

TEST(SharedMemorySessionsTest, AnOfferThatCannotBeMappedSaysWhyAndBindsNothing) {
  SharedMemorySessions sessions;
  Offered good = Offer();
  ASSERT_TRUE(sessions.Attach(3, "s1", &good.offer, kBytes).ok());
  Offered bad = Offer();
  bad.offer.set_nonce("0123456789abcdef");
  const absl::Status status = sessions.Attach(3, "s2", &bad.offer, kBytes);
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(sessions.SegmentOf("s2"), nullptr);
  EXPECT_EQ(sessions.SegmentOf("s1"), nullptr);  // replaced by the new session
  // Larger than the server allows.
  Offered big = Offer(2 * kBytes);
  EXPECT_EQ(sessions.Attach(4, "s3", &big.offer, kBytes).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sessions.SegmentOf("s3"), nullptr);
}

TEST(SharedMemorySessionsTest, ARegistrationSaysWhetherItsOfferWasMapped) {
  SharedMemorySessions sessions;
  Offered good = Offer();
  proto::RegisterRequest request;
  *request.mutable_shared_memory() = good.offer;
  proto::RegisterReply reply;
  sessions.Register(request, 0, "s1", kBytes, &reply);
  EXPECT_TRUE(reply.shared_memory_attached());
  EXPECT_EQ(reply.shared_memory_error(), "");
  EXPECT_NE(sessions.SegmentOf("s1"), nullptr);
  request.mutable_shared_memory()->set_data_bytes(kBytes + 1);
  reply.Clear();
  sessions.Register(request, 0, "s2", kBytes, &reply);
  EXPECT_FALSE(reply.shared_memory_attached());
  EXPECT_NE(reply.shared_memory_error(), "");
  EXPECT_EQ(sessions.SegmentOf("s1"), nullptr);
  // No offer: nothing said, and the rank's earlier segment goes.
  ASSERT_TRUE(sessions.Attach(1, "s3", &good.offer, kBytes).ok());
  reply.Clear();
  sessions.Register(proto::RegisterRequest(), 1, "s4", kBytes, &reply);
  EXPECT_FALSE(reply.shared_memory_attached());
  EXPECT_EQ(reply.shared_memory_error(), "");
  EXPECT_EQ(sessions.SegmentOf("s3"), nullptr);
}

proto::TensorChunk ChunkAt(int64_t offset, int64_t bytes) {
  proto::TensorChunk chunk;
  chunk.set_key(2);
  chunk.set_chunk(1);
  chunk.set_in_shared_memory(true);
  chunk.set_shm_offset(offset);
  chunk.set_data_bytes(bytes);
  return chunk;
}

TEST(SharedMemorySessionsTest, APushedChunkIsCheckedThenCopiedOut) {
  Offered o = Offer();
  const float values[3] = {1.5f, -2.f, 3.25f};
  std::memcpy(o.created->data() + 64, values, sizeof(values));
  const proto::TensorChunk chunk = ChunkAt(64, sizeof(values));
  absl::StatusOr<int64_t> elements =
      SharedMemoryChunkElements(o.created.get(), chunk, /*push=*/true, "push");
  ASSERT_TRUE(elements.ok()) << elements.status();
  ASSERT_EQ(*elements, 3);
  std::vector<float> out(3);
  CopyFromSharedMemory(*o.created, chunk, absl::MakeSpan(out));
  EXPECT_THAT(out, ElementsAre(1.5f, -2.f, 3.25f));
}

TEST(SharedMemorySessionsTest, MalformedPushedChunksAreRefusedNamingTheProblem) {
  Offered o = Offer();
  auto refusal = [&](const SharedMemorySegment* segment, const proto::TensorChunk& chunk,
                     bool push) {
    absl::StatusOr<int64_t> elements = SharedMemoryChunkElements(segment, chunk, push, "push");
    EXPECT_EQ(elements.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(elements.status().message());
  };
  EXPECT_THAT(refusal(o.created.get(), ChunkAt(0, 8), /*push=*/false),
              HasSubstr("only pushes of dense F32 chunks may be"));
  proto::TensorChunk half = ChunkAt(0, 8);
  half.set_dtype(proto::DTYPE_F16);
  EXPECT_THAT(refusal(o.created.get(), half, true), HasSubstr("only pushes of dense F32"));
  proto::TensorChunk topk = ChunkAt(0, 8);
  topk.set_encoding(proto::ENCODING_TOPK);
  EXPECT_THAT(refusal(o.created.get(), topk, true), HasSubstr("only pushes of dense F32"));
  EXPECT_THAT(refusal(nullptr, ChunkAt(0, 8), true), HasSubstr("this session has none attached"));
  EXPECT_THAT(refusal(o.created.get(), ChunkAt(kBytes - 4, 8), true),
              HasSubstr("not whole F32 elements inside the shared memory's 4096"));
  EXPECT_THAT(refusal(o.created.get(), ChunkAt(-4, 4), true), HasSubstr("bytes [-4, +4)"));
  EXPECT_THAT(refusal(o.created.get(), ChunkAt(0, 6), true), HasSubstr("not whole F32"));
  EXPECT_THAT(refusal(o.created.get(), ChunkAt(INT64_MAX, INT64_MAX), true),
              HasSubstr("not whole F32"));
}

TEST(SharedMemorySessionsTest, APullIntoSharedMemoryIsCheckedThenWrittenAndDescribed) {
  Offered o = Offer();
  proto::PullRequest pull;
  pull.set_shared_memory(true);
  pull.add_chunks()->set_key(1);
  EXPECT_THAT(CheckPullIntoSharedMemory(nullptr, pull).message(), HasSubstr("none attached"));
  EXPECT_THAT(CheckPullIntoSharedMemory(o.created.get(), pull).message(),
              HasSubstr("gives 0 offsets for 1 chunks"));
  pull.add_shm_offsets(128);
  EXPECT_TRUE(CheckPullIntoSharedMemory(o.created.get(), pull).ok());
  pull.set_delta(true);
  EXPECT_THAT(CheckPullIntoSharedMemory(o.created.get(), pull).message(),
              HasSubstr("must be dense F32"));
  pull.set_delta(false);
  pull.set_dtype(proto::DTYPE_BF16);
  EXPECT_EQ(CheckPullIntoSharedMemory(o.created.get(), pull).code(),
            absl::StatusCode::kInvalidArgument);

  proto::ChunkId id;
  id.set_key(1);
  EXPECT_TRUE(CheckPullTarget(*o.created, id, kBytes - 8, 2).ok());
  EXPECT_THAT(CheckPullTarget(*o.created, id, kBytes - 8, 3).message(),
              HasSubstr("its 12 bytes do not fit in 4096"));
  EXPECT_FALSE(CheckPullTarget(*o.created, id, -1, 0).ok());

  const std::vector<float> values = {7.f, 8.f};
  proto::TensorChunk described;
  WriteToSharedMemory(values, 128, *o.created, &described);
  float written[2];
  std::memcpy(written, o.created->data() + 128, sizeof(written));
  EXPECT_THAT(written, ElementsAre(7.f, 8.f));
  EXPECT_TRUE(described.in_shared_memory());
  EXPECT_EQ(described.shm_offset(), 128);
  EXPECT_EQ(described.data_bytes(), 8);
  EXPECT_EQ(described.dtype(), proto::DTYPE_F32);
}

}  // namespace
}  // namespace ps::server
