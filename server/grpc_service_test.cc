// Hostile and malformed RPCs get specific statuses over the real wire, and
// the server's state survives them.

#include "server/grpc_service.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

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
    stub_ = proto::ParameterServer::NewStub(grpc::CreateChannel(
        absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
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

  grpc::Status PushMany(const std::vector<ChunkSpec>& chunks, int64_t iteration = 0) {
    proto::PushRequest request;
    request.set_rank(0);
    request.set_iteration(iteration);
    request.set_num_samples(1);
    for (const ChunkSpec& c : chunks) {
      proto::TensorChunk* chunk = request.add_chunks();
      chunk->set_key(c.key);
      chunk->set_chunk(c.chunk);
      chunk->set_dtype(c.dtype);
      std::string data(reinterpret_cast<const char*>(c.values.data()), c.values.size() * 4);
      data.append(c.extra_bytes, '\0');
      chunk->set_data(data);
    }
    grpc::ClientContext context;
    proto::PushReply reply;
    return stub_->Push(&context, request, &reply);
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
    grpc::ClientContext context;
    return stub_->Pull(&context, request, reply);
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

  // The server still works and the update reflects only the good pushes.
  EXPECT_EQ(PullAll(), (std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}));
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

}  // namespace
}  // namespace ps::server
