// Hostile and malformed RPCs get specific statuses over the real wire, and
// the server's state survives them.

#include "server/grpc_service.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/wire_format.h"

namespace ps::server {
namespace {

using ::testing::HasSubstr;

class GrpcServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ParameterServerOptions options;
    options.num_workers = 1;
    options.chunk_elements = 4;
    options.optimizer.sgd.lr = 1.f;
    auto server = ParameterServer::Create(
        options, {{"w", {6}, DType::kF32}, {"b", {2}, DType::kF32}},
        {1, 2, 3, 4, 5, 6, 7, 8}, &device_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(server).value();
    service_ = std::make_unique<ParameterServerService>(server_.get());
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    grpc_server_ = builder.BuildAndStart();
    ASSERT_NE(port, 0);
    auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                                       grpc::InsecureChannelCredentials());
    stub_ = proto::ParameterServer::NewStub(channel);
    raw_stub_ = std::make_unique<grpc::GenericStub>(channel);
  }
  void TearDown() override { grpc_server_->Shutdown(); }

  grpc::Status Register(const std::string& id, std::vector<int64_t> w_shape = {6}) {
    proto::RegisterRequest request;
    request.set_worker_id(id);
    proto::TensorSpec* w = request.add_signature();
    w->set_name("w");
    for (int64_t d : w_shape) w->add_shape(d);
    proto::TensorSpec* b = request.add_signature();
    b->set_name("b");
    b->add_shape(2);
    grpc::ClientContext context;
    proto::RegisterReply reply;
    return stub_->Register(&context, request, &reply);
  }

  struct ChunkSpec {
    int key;
    int64_t chunk;
    std::vector<float> values;
    proto::DType dtype = proto::DTYPE_F32;
    int extra_bytes = 0;
  };

  // One raw (framed) call, as the worker's store makes them.
  grpc::Status RawCall(const char* method, const grpc::ByteBuffer& request,
                       grpc::ByteBuffer* reply) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::Status status;
    absl::Notification done;
    raw_stub_->UnaryCall(&context, method, grpc::StubOptions(), &request, reply,
                         [&](grpc::Status s) {
                           status = std::move(s);
                           done.Notify();
                         });
    done.WaitForNotification();
    return status;
  }
  grpc::Status RawCall(const char* method, const std::string& bytes) {
    grpc::Slice slice(bytes);
    grpc::ByteBuffer reply;
    return RawCall(method, grpc::ByteBuffer(&slice, 1), &reply);
  }

  // The frame of a push: header, then each chunk's bytes (extra_bytes more
  // than its values).
  static grpc::ByteBuffer PushFrame(const std::vector<ChunkSpec>& chunks, int64_t iteration) {
    proto::PushRequest request;
    request.set_rank(0);
    request.set_iteration(iteration);
    request.set_num_samples(1);
    std::vector<grpc::Slice> data;
    for (const ChunkSpec& c : chunks) {
      proto::TensorChunk* chunk = request.add_chunks();
      chunk->set_key(c.key);
      chunk->set_chunk(c.chunk);
      chunk->set_dtype(c.dtype);
      std::string bytes(reinterpret_cast<const char*>(c.values.data()), c.values.size() * 4);
      bytes.append(c.extra_bytes, '\0');
      chunk->set_data_bytes(static_cast<int64_t>(bytes.size()));
      data.emplace_back(bytes);
    }
    return proto::MakeFrame(request, data);
  }

  static std::string Bytes(const grpc::ByteBuffer& buffer) {
    std::vector<grpc::Slice> slices;
    EXPECT_TRUE(buffer.Dump(&slices).ok());
    std::string out;
    for (const grpc::Slice& s : slices) {
      out.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
    return out;
  }

  grpc::Status PushMany(const std::vector<ChunkSpec>& chunks, int64_t iteration = 0) {
    grpc::ByteBuffer reply;
    return RawCall(proto::kPushMethod, PushFrame(chunks, iteration), &reply);
  }

  grpc::Status Push(int key, int64_t chunk, std::vector<float> values, int64_t iteration = 0,
                    proto::DType dtype = proto::DTYPE_F32, int extra_bytes = 0) {
    return PushMany({{key, chunk, std::move(values), dtype, extra_bytes}}, iteration);
  }

  grpc::Status Pull(const std::vector<std::pair<int, int64_t>>& ids, proto::PullReply* reply,
                    int64_t version = 0, int64_t timeout_ms = 1000) {
    proto::PullRequest request;
    request.set_version(version);
    request.set_timeout_ms(timeout_ms);
    for (const auto& [key, chunk] : ids) {
      proto::ChunkId* id = request.add_chunks();
      id->set_key(key);
      id->set_chunk(chunk);
    }
    grpc::ByteBuffer frame;
    grpc::Status status = RawCall(proto::kPullMethod, proto::SerializeMessage(request), &frame);
    if (!status.ok()) return status;
    // Back to a PullReply with its data inside, for the checks.
    auto reader = proto::FrameReader::Open(frame, "pull reply", reply);
    EXPECT_TRUE(reader.ok()) << reader.status();
    if (!reader.ok()) return grpc::Status(grpc::StatusCode::INTERNAL, "bad frame");
    EXPECT_TRUE(reader->Split(reply->chunks()).ok());
    for (int c = 0; c < reply->chunks_size(); ++c) {
      std::string* data = reply->mutable_chunks(c)->mutable_data();
      for (absl::string_view piece : reader->pieces(c)) data->append(piece.data(), piece.size());
    }
    return status;
  }

  std::vector<float> PullAll() {
    std::vector<float> out(8);
    EXPECT_TRUE(server_->Pull(0, absl::InfiniteFuture(), absl::MakeSpan(out)).ok());
    return out;
  }

  CpuDevice device_{0, 1};
  std::unique_ptr<ParameterServer> server_;
  std::unique_ptr<ParameterServerService> service_;
  std::unique_ptr<grpc::Server> grpc_server_;
  std::unique_ptr<proto::ParameterServer::Stub> stub_;
  std::unique_ptr<grpc::GenericStub> raw_stub_;
};

TEST_F(GrpcServiceTest, MalformedAndHostileCallsGetSpecificStatuses) {
  // A signature mismatch, then a good registration and a second worker.
  grpc::Status s = Register("a", {7});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("'w' has shape [6] on the server but [7]"));
  ASSERT_TRUE(Register("a").ok());
  EXPECT_EQ(Register("b").error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);

  s = Push(0, 0, {1, 1, 1}, 0, proto::DTYPE_F32, /*extra_bytes=*/2);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("not a whole number of F32 elements"));
  s = Push(0, 0, {1, 1, 1, 1}, 0, proto::DTYPE_BF16);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Push(0, 0, {1, 1, 1}).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Push(9, 0, {1}).error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_EQ(Push(0, 5, {1}).error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_EQ(Push(0, 0, {1, 1, 1, 1}, 3).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  ASSERT_TRUE(Push(0, 0, {1, 1, 1, 1}).ok());
  EXPECT_EQ(Push(0, 0, {1, 1, 1, 1}).error_code(), grpc::StatusCode::ALREADY_EXISTS);

  // A pull of a chunk that does not exist, one for a far future version, and
  // one asking for more than a message may carry.
  {
    proto::PullReply reply;
    EXPECT_EQ(Pull({{1, 1}}, &reply).error_code(), grpc::StatusCode::OUT_OF_RANGE);
  }
  {
    proto::PullReply reply;
    EXPECT_EQ(Pull({{1, 0}}, &reply, 1000, 50).error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  {
    proto::PullReply reply;
    s = Pull({{0, 0}, {0, 1}}, &reply);  // 6 elements; a message holds 4
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("more than 4 elements in one message"));
  }

  // A message with one bad chunk adds none of its chunks.
  s = PushMany({{0, 1, {1, 1}}, {1, 0, {2, NAN}}});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  s = PushMany({{0, 1, {1, 1}}, {0, 1, {1, 1}}});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_THAT(s.error_message(), HasSubstr("already pushed"));

  // The server still works and the update reflects only the good pushes:
  // chunk (0, 0) was applied when its only worker pushed it (per-chunk
  // publishing); the rest is untouched by the refused messages.
  EXPECT_EQ(PullAll(), (std::vector<float>{0, 1, 2, 3, 5, 6, 7, 8}));
  ASSERT_TRUE(PushMany({{0, 1, {1, 1}}, {1, 0, {2, 2}}}).ok());  // two keys, one message
  EXPECT_EQ(server_->version(), 1);
  EXPECT_EQ(PullAll(), (std::vector<float>{0, 1, 2, 3, 4, 5, 5, 6}));
}

TEST_F(GrpcServiceTest, PullReturnsChunksAsLittleEndianBytesInRequestOrder) {
  ASSERT_TRUE(Register("a").ok());
  proto::PullReply reply;
  ASSERT_TRUE(Pull({{1, 0}, {0, 1}}, &reply).ok());
  ASSERT_EQ(reply.chunks_size(), 2);
  EXPECT_EQ(reply.chunks(0).key(), 1);
  EXPECT_EQ(reply.chunks(1).chunk(), 1);
  ASSERT_EQ(reply.chunks(1).data().size(), 8u);
  float values[2];
  std::memcpy(values, reply.chunks(0).data().data(), 8);
  EXPECT_EQ(values[0], 7.f);
  EXPECT_EQ(values[1], 8.f);
  std::memcpy(values, reply.chunks(1).data().data(), 8);
  EXPECT_EQ(values[0], 5.f);
  EXPECT_EQ(values[1], 6.f);
  EXPECT_EQ(reply.version(), 0);
}

TEST_F(GrpcServiceTest, MalformedFramesAreRefusedAndChangeNothing) {
  ASSERT_TRUE(Register("a").ok());
  const std::string good = Bytes(PushFrame({{0, 0, {1, 1, 1, 1}}}, 0));
  struct Case {
    const char* what;
    std::string bytes;
    const char* message;
  };
  proto::PushRequest plain;  // an old client's message: data inside the protobuf
  plain.set_iteration(0);
  proto::TensorChunk* chunk = plain.add_chunks();
  chunk->set_data(std::string(16, '\0'));
  proto::PushRequest inside;  // a frame whose chunk carries data in its header
  inside.add_chunks()->set_data(std::string(16, '\0'));
  const std::vector<Case> cases = {
      {"empty", "", "shorter than the 4-byte header length"},
      {"header length past the end", std::string("\x40\x00\x00\x00", 4) + "abc",
       "a header of 64 bytes runs past the end of a 7-byte message"},
      {"garbage header", std::string("\x04\x00\x00\x00", 4) + "\xff\xff\xff\xff",
       "header is not a parsable message"},
      {"truncated data", good.substr(0, good.size() - 3), "announces 16 bytes but only 13 follow"},
      {"trailing bytes", good + "x", "1 bytes follow the data its header announces"},
      {"plain protobuf", plain.SerializeAsString(), "malformed push"},
      {"data in the header", Bytes(proto::MakeFrame(inside, {})), "carries data inside the header"},
  };
  for (const Case& c : cases) {
    grpc::Status s = RawCall(proto::kPushMethod, c.bytes);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.what;
    EXPECT_THAT(s.error_message(), HasSubstr(c.message)) << c.what;
  }
  // Initialize reads frames the same way (the last two cases parse as
  // headers of another message, so they fail later, for other reasons).
  for (size_t c = 0; c + 2 < cases.size(); ++c) {
    grpc::Status s = RawCall(proto::kInitializeMethod, cases[c].bytes);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << cases[c].what;
    EXPECT_THAT(s.error_message(), HasSubstr("malformed initial parameters")) << cases[c].what;
  }
  grpc::Status s = RawCall(proto::kPullMethod, "\xff\xff\xff");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("malformed pull request"));

  // Nothing was added: a whole good push still makes version 1 as usual.
  EXPECT_EQ(PullAll(), (std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}));
  ASSERT_TRUE(PushMany({{0, 0, {1, 1, 1, 1}}, {0, 1, {1, 1}}, {1, 0, {1, 1}}}).ok());
  EXPECT_EQ(server_->version(), 1);
  EXPECT_EQ(PullAll(), (std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST_F(GrpcServiceTest, APullForAFutureVersionWaitsOffGrpcsThreadsAndGetsIt) {
  ASSERT_TRUE(Register("a").ok());
  proto::PullReply reply;
  grpc::Status pulled;
  std::thread puller([&] { pulled = Pull({{1, 0}}, &reply, /*version=*/1, /*timeout_ms=*/10000); });
  // While it waits, pushes are served: they make the version it waits for.
  absl::SleepFor(absl::Milliseconds(50));
  ASSERT_TRUE(PushMany({{0, 0, {1, 1, 1, 1}}, {0, 1, {1, 1}}, {1, 0, {1, 1}}}).ok());
  puller.join();
  ASSERT_TRUE(pulled.ok()) << pulled.error_message();
  EXPECT_EQ(reply.version(), 1);
  ASSERT_EQ(reply.chunks(0).data().size(), 8u);
  float values[2];
  std::memcpy(values, reply.chunks(0).data().data(), 8);
  EXPECT_EQ(values[0], 6.f);
  EXPECT_EQ(values[1], 7.f);
}

}  // namespace
}  // namespace ps::server
