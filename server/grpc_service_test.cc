// Hostile and malformed RPCs get specific statuses over the real wire, and
// the server's state survives them.

#include "server/grpc_service.h"
#include "server/parameter_server_testing.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/shared_memory.h"
#include "proto/wire_format.h"

namespace ps::server {
namespace {

using ::testing::HasSubstr;

// A number field of /proc/self/status ("Threads:", "VmRSS:" in kB), -1 if
// unreadable.
int64_t ProcStatus(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field, 0) == 0) return std::stoll(line.substr(field.size()));
  }
  return -1;
}
int ThreadCount() { return static_cast<int>(ProcStatus("Threads:")); }

// Counts completed calls; a test waits for a number of them.
class Completions {
 public:
  void Add() {
    absl::MutexLock lock(&mu_);
    ++done_;
  }
  // Whether `n` calls complete within `timeout`.
  bool WaitFor(int n, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto reached = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
  }
  int done() {
    absl::MutexLock lock(&mu_);
    return done_;
  }

 private:
  absl::Mutex mu_;
  int done_ ABSL_GUARDED_BY(mu_) = 0;
};

// A pull in flight, made without a thread of its own.
struct AsyncPull {
  grpc::ClientContext context;
  grpc::ByteBuffer request;
  grpc::ByteBuffer frame;
  grpc::Status status;
};

// One raw (framed) call with `context`, 10 s deadline, waited for.
grpc::Status BlockingRawCall(grpc::GenericStub& stub, grpc::ClientContext* context,
                             const char* method, const grpc::ByteBuffer& request,
                             grpc::ByteBuffer* reply) {
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(context, method, grpc::StubOptions(), &request, reply, [&](grpc::Status s) {
    status = std::move(s);
    done.Notify();
  });
  done.WaitForNotification();
  return status;
}

// Serves `service` on a free loopback port and makes the typed and raw
// stubs that talk to it.
void Serve(ParameterServerService* service, std::unique_ptr<grpc::Server>* grpc_server,
           std::unique_ptr<proto::ParameterServer::Stub>* stub,
           std::unique_ptr<grpc::GenericStub>* raw_stub) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(service);
  *grpc_server = builder.BuildAndStart();
  ASSERT_NE(port, 0);
  auto channel =
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
  *stub = proto::ParameterServer::NewStub(channel);
  *raw_stub = std::make_unique<grpc::GenericStub>(channel);
}

class GrpcServiceTest : public ::testing::Test {
 protected:
  void SetUp() override { StartServer(ServiceOptions().max_waiting_pulls); }

  void StartServer(int64_t max_waiting_pulls) {
    ParameterServerOptions options;
    options.num_workers = 1;
    options.chunk_elements = 4;
    options.optimizer.sgd.lr = 1.f;
    auto server = ParameterServer::Create(
        options, {{"w", {6}, DType::kF32}, {"b", {2}, DType::kF32}},
        {1, 2, 3, 4, 5, 6, 7, 8}, &device_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(server).value();
    ServiceOptions service_options;
    service_options.max_waiting_pulls = max_waiting_pulls;
    service_ = std::make_unique<ParameterServerService>(server_.get(), service_options);
    ASSERT_NO_FATAL_FAILURE(Serve(service_.get(), &grpc_server_, &stub_, &raw_stub_));
  }
  void TearDown() override {
    // Waiting pulls are answered first: the server's Shutdown waits for
    // every call in flight.
    service_->Shutdown();
    grpc_server_->Shutdown();
  }

  grpc::Status Register(const std::string& id, std::vector<int64_t> w_shape = {6}) {
    proto::RegisterRequest request;
    request.set_worker_id(id);
    request.set_identity_proof(id + "'s secret");  // registering again is a restart
    proto::TensorSpec* w = request.add_signature();
    w->set_name("w");
    for (int64_t d : w_shape) w->add_shape(d);
    proto::TensorSpec* b = request.add_signature();
    b->set_name("b");
    b->add_shape(2);
    grpc::ClientContext context;
    proto::RegisterReply reply;
    grpc::Status status = stub_->Register(&context, request, &reply);
    if (status.ok()) session_ = reply.session();
    return status;
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
    // The last registration's credential, as a worker's store sends it.
    if (!session_.empty()) context.AddMetadata(proto::kSessionMetadataKey, session_);
    return BlockingRawCall(*raw_stub_, &context, method, request, reply);
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

  // A push of iteration 0 from rank 0 (one sample) of one chunk whose data
  // are `bytes` as they are, in `dtype` and `encoding`.
  static grpc::ByteBuffer OneChunkPush(int key, int64_t chunk, proto::DType dtype,
                                       proto::Encoding encoding, const std::string& bytes) {
    proto::PushRequest request;
    request.set_rank(0);
    request.set_iteration(0);
    request.set_num_samples(1);
    proto::TensorChunk* c = request.add_chunks();
    c->set_key(key);
    c->set_chunk(chunk);
    c->set_dtype(dtype);
    c->set_encoding(encoding);
    c->set_data_bytes(static_cast<int64_t>(bytes.size()));
    std::vector<grpc::Slice> data = {grpc::Slice(bytes)};
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

  static proto::PullRequest PullRequestOf(const std::vector<std::pair<int, int64_t>>& ids,
                                          int64_t version, int64_t timeout_ms) {
    proto::PullRequest request;
    request.set_version(version);
    request.set_timeout_ms(timeout_ms);
    for (const auto& [key, chunk] : ids) {
      proto::ChunkId* id = request.add_chunks();
      id->set_key(key);
      id->set_chunk(chunk);
    }
    return request;
  }
  static grpc::ByteBuffer PullRequestBytes(const std::vector<std::pair<int, int64_t>>& ids,
                                           int64_t version, int64_t timeout_ms) {
    return proto::SerializeMessage(PullRequestOf(ids, version, timeout_ms));
  }

  grpc::Status Pull(const std::vector<std::pair<int, int64_t>>& ids, proto::PullReply* reply,
                    int64_t version = 0, int64_t timeout_ms = 1000) {
    grpc::ByteBuffer frame;
    grpc::Status status =
        RawCall(proto::kPullMethod, PullRequestBytes(ids, version, timeout_ms), &frame);
    if (!status.ok()) return status;
    return ParsePullReply(frame, reply);
  }

  // Starts a pull (client deadline 60 s) and returns without waiting;
  // `done` counts it once it completes.
  void StartPull(AsyncPull* pull, const std::vector<std::pair<int, int64_t>>& ids,
                 int64_t version, int64_t timeout_ms, Completions* done) {
    pull->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    pull->request = PullRequestBytes(ids, version, timeout_ms);
    raw_stub_->UnaryCall(&pull->context, proto::kPullMethod, grpc::StubOptions(), &pull->request,
                         &pull->frame, [pull, done](grpc::Status s) {
                           pull->status = std::move(s);
                           done->Add();
                         });
  }

  // Whether `n` pulls wait in the service within 10 s.
  bool AwaitWaitingPulls(int64_t n) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (service_->waiting_pulls() != n) {
      if (absl::Now() > deadline) return false;
      absl::SleepFor(absl::Milliseconds(1));
    }
    return true;
  }

  // Back to a PullReply with its data inside, for the checks.
  static grpc::Status ParsePullReply(const grpc::ByteBuffer& frame, proto::PullReply* reply) {
    auto reader = proto::FrameReader::Open(frame, "pull reply", reply);
    EXPECT_TRUE(reader.ok()) << reader.status();
    if (!reader.ok()) return grpc::Status(grpc::StatusCode::INTERNAL, "bad frame");
    EXPECT_TRUE(reader->Split(reply->chunks()).ok());
    for (int c = 0; c < reply->chunks_size(); ++c) {
      std::string* data = reply->mutable_chunks(c)->mutable_data();
      for (absl::string_view piece : reader->pieces(c)) data->append(piece.data(), piece.size());
    }
    return grpc::Status::OK;
  }

  // The F32 values of a pulled chunk.
  static std::vector<float> Values(const proto::TensorChunk& chunk) {
    std::vector<float> values(chunk.data().size() / sizeof(float));
    std::memcpy(values.data(), chunk.data().data(), values.size() * sizeof(float));
    return values;
  }

  std::vector<float> PullAll() {
    std::vector<float> out(8);
    EXPECT_TRUE(server::Pull(*server_, 0, absl::InfiniteFuture(), absl::MakeSpan(out)).ok());
    return out;
  }

  CpuDevice device_{0, 1};
  std::unique_ptr<ParameterServer> server_;
  std::unique_ptr<ParameterServerService> service_;
  std::unique_ptr<grpc::Server> grpc_server_;
  std::unique_ptr<proto::ParameterServer::Stub> stub_;
  std::unique_ptr<grpc::GenericStub> raw_stub_;
  std::string session_;  // from the last successful Register
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

  // A push computed from a version below 0 (its staleness would overflow).
  {
    proto::PushRequest request;
    request.set_rank(0);
    request.set_num_samples(1);
    request.set_based_on_version(std::numeric_limits<int64_t>::min());
    proto::TensorChunk* c = request.add_chunks();
    c->set_key(0);
    c->set_chunk(1);
    const std::string bytes(8, '\0');
    c->set_data_bytes(8);
    grpc::ByteBuffer reply;
    s = RawCall(proto::kPushMethod, proto::MakeFrame(request, {grpc::Slice(bytes)}), &reply);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("versions start at 0"));
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

// A registration that offers shared memory (a worker on this host): the
// service maps it, pushes naming ranges of it are copied out, checked and
// summed like framed ones, pulls are written into it; hostile offers and
// ranges are refused, naming the problem, and change nothing.
TEST_F(GrpcServiceTest, SharedMemoryPushesAndPullsAndTheirHostileForms) {
  auto segment = SharedMemorySegment::Create(64);  // 8 bytes for each of 8 parameters
  ASSERT_TRUE(segment.ok()) << segment.status();
  auto register_offering = [&](int64_t bytes, const std::string& nonce,
                               proto::RegisterReply* reply) {
    proto::RegisterRequest request;
    request.set_worker_id("a");
    request.set_identity_proof("a's secret");
    proto::TensorSpec* w = request.add_signature();
    w->set_name("w");
    w->add_shape(6);
    proto::TensorSpec* b = request.add_signature();
    b->set_name("b");
    b->add_shape(2);
    proto::SharedMemory* shm = request.mutable_shared_memory();
    shm->set_pid((*segment)->pid());
    shm->set_fd((*segment)->fd());
    shm->set_data_bytes(bytes);
    shm->set_nonce(nonce);
    grpc::ClientContext context;
    grpc::Status status = stub_->Register(&context, request, reply);
    if (status.ok()) session_ = reply->session();
    return status;
  };
  // Offers the service cannot or will not map: the registration stands,
  // without shared memory, and the reply says why.
  {
    proto::RegisterReply reply;
    ASSERT_TRUE(register_offering(64, "0123456789abcdef", &reply).ok());
    EXPECT_FALSE(reply.shared_memory_attached());
    EXPECT_THAT(reply.shared_memory_error(), HasSubstr("nonce"));
    ASSERT_TRUE(register_offering(1 << 20, (*segment)->nonce(), &reply).ok());
    EXPECT_FALSE(reply.shared_memory_attached());
    EXPECT_THAT(reply.shared_memory_error(), HasSubstr("bytes"));
  }
  // Without it attached, a push or pull naming it is refused.
  auto shm_push = [&](std::vector<std::tuple<int, int64_t, int64_t, int64_t>> chunks,
                      proto::DType dtype = proto::DTYPE_F32) {
    proto::PushRequest request;
    request.set_rank(0);
    request.set_iteration(0);
    request.set_num_samples(1);
    for (const auto& [key, chunk, offset, bytes] : chunks) {
      proto::TensorChunk* c = request.add_chunks();
      c->set_key(key);
      c->set_chunk(chunk);
      c->set_dtype(dtype);
      c->set_data_bytes(bytes);
      c->set_in_shared_memory(true);
      c->set_shm_offset(offset);
    }
    grpc::ByteBuffer reply;
    return RawCall(proto::kPushMethod, proto::MakeFrame(request, {}), &reply);
  };
  auto shm_pull = [&](std::vector<std::pair<int, int64_t>> ids, std::vector<int64_t> offsets,
                      proto::PullReply* reply, proto::DType dtype = proto::DTYPE_F32) {
    proto::PullRequest request = PullRequestOf(ids, /*version=*/1, /*timeout_ms=*/1000);
    request.set_dtype(dtype);
    request.set_shared_memory(true);
    for (int64_t offset : offsets) request.add_shm_offsets(offset);
    grpc::ByteBuffer frame;
    grpc::Status status = RawCall(proto::kPullMethod, proto::SerializeMessage(request), &frame);
    if (status.ok()) status = ParsePullReply(frame, reply);
    return status;
  };
  grpc::Status s = shm_push({{0, 0, 0, 16}});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("none attached"));
  {
    proto::PullReply reply;
    s = shm_pull({{1, 0}}, {56}, &reply);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("none attached"));
  }
  proto::RegisterReply reply;
  ASSERT_TRUE(register_offering(64, (*segment)->nonce(), &reply).ok());
  ASSERT_TRUE(reply.shared_memory_attached()) << reply.shared_memory_error();

  // The gradient in the push area: w's chunks at bytes 0 and 16, b's at 24.
  const float gradient[8] = {1, 1, 1, 1, 2, 2, 3, NAN};
  std::memcpy((*segment)->data(), gradient, sizeof(gradient));
  // Hostile and malformed pushes: a range past the end, across it, a
  // negative offset, a length that is no whole element, a dtype other
  // than F32, and a NaN.
  s = shm_push({{0, 0, 56, 16}});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("inside the shared memory's 64"));
  EXPECT_EQ(shm_push({{0, 0, INT64_MAX - 4, 16}}).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(shm_push({{0, 0, -16, 16}}).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(shm_push({{0, 0, 0, 15}}).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(shm_push({{0, 0, 0, 8}}, proto::DTYPE_F16).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  // One chunk named twice, each a copy of up to the whole segment: counted
  // (and refused) before anything is copied.
  s = shm_push({{0, 0, 0, 16}, {0, 0, 0, 16}});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("decodes to more than 4 elements"));
  s = shm_push({{0, 1, 16, 8}, {1, 0, 24, 8}});  // b's second element is NaN
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(server_->version(), 0);
  EXPECT_EQ(PullAll(), (std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}));
  // The good push (one worker, lr 1, one sample): version 1.
  const float finite = 4;
  std::memcpy((*segment)->data() + 28, &finite, sizeof(finite));
  ASSERT_TRUE(shm_push({{0, 0, 0, 16}}).ok());
  ASSERT_TRUE(shm_push({{0, 1, 16, 8}, {1, 0, 24, 8}}).ok());
  EXPECT_EQ(server_->version(), 1);
  const std::vector<float> expected = {0, 1, 2, 3, 3, 4, 4, 4};
  EXPECT_EQ(PullAll(), expected);

  // Pulls into the pull area: refused where the offsets do not match the
  // chunks, a chunk would not fit, or the dtype is not F32.
  proto::PullReply pulled;
  s = shm_pull({{0, 1}, {1, 0}}, {48}, &pulled);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("1 offsets for 2 chunks"));
  s = shm_pull({{0, 0}}, {52}, &pulled);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("do not fit"));
  EXPECT_EQ(shm_pull({{0, 0}}, {32}, &pulled, proto::DTYPE_BF16).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  float before[8];
  std::memcpy(before, (*segment)->data() + 32, sizeof(before));
  EXPECT_EQ(std::memcmp(before, std::vector<float>(8, 0.f).data(), sizeof(before)), 0)
      << "a refused pull wrote into the pull area";
  ASSERT_TRUE(shm_pull({{0, 0}}, {32}, &pulled).ok());
  ASSERT_TRUE(shm_pull({{0, 1}, {1, 0}}, {48, 56}, &pulled).ok());
  ASSERT_EQ(pulled.chunks_size(), 2);
  EXPECT_TRUE(pulled.chunks(1).in_shared_memory());
  EXPECT_EQ(pulled.chunks(1).shm_offset(), 56);
  EXPECT_EQ(pulled.chunks(1).data_bytes(), 8);
  EXPECT_TRUE(pulled.chunks(1).data().empty());  // no byte came by TCP
  float got[8];
  std::memcpy(got, (*segment)->data() + 32, sizeof(got));
  EXPECT_EQ(std::vector<float>(got, got + 8), expected);
  // A later registration without an offer drops the memory.
  ASSERT_TRUE(Register("a").ok());
  EXPECT_THAT(shm_pull({{0, 0}}, {32}, &pulled).error_message(), HasSubstr("none attached"));
}

// --compression on the wire: pushes in F16 or BF16 are decoded into fp32
// before the sum, pulls are encoded as each asks; a malformed encoding (an
// odd byte count, the wrong element count, a NaN, an initial value or a
// pull dtype no codec serves) is refused and changes nothing.
TEST_F(GrpcServiceTest, HalfPrecisionPushesAndPullsAndTheirMalformedForms) {
  ASSERT_TRUE(Register("a").ok());
  auto frame = [](int key, int64_t chunk, proto::DType dtype, const std::string& bytes) {
    return OneChunkPush(key, chunk, dtype, proto::ENCODING_DENSE, bytes);
  };
  auto halves = [](std::vector<uint16_t> bits) {
    return std::string(reinterpret_cast<const char*>(bits.data()), bits.size() * 2);
  };
  grpc::ByteBuffer reply;
  // Odd bytes, three elements for a chunk of four, a NaN, F16 initial values.
  grpc::Status s = RawCall(proto::kPushMethod,
                           frame(0, 0, proto::DTYPE_F16, std::string(7, '\0')), &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("not a whole number of fp16 elements"));
  s = RawCall(proto::kPushMethod, frame(0, 0, proto::DTYPE_F16, halves({0x3c00, 0x3c00, 0x3c00})),
              &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  s = RawCall(proto::kPushMethod,
              frame(0, 0, proto::DTYPE_BF16, halves({0x3f80, 0x7fc0, 0x3f80, 0x3f80})), &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("is nan; refusing a non-finite value"));
  EXPECT_EQ(PullAll(), (std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}));
  // 1.0, 0.5, 2.0, -1.0 as fp16 and 0.25, 0.25 as bf16: lr 1, one sample.
  ASSERT_TRUE(RawCall(proto::kPushMethod,
                      frame(0, 0, proto::DTYPE_F16, halves({0x3c00, 0x3800, 0x4000, 0xbc00})),
                      &reply)
                  .ok());
  ASSERT_TRUE(RawCall(proto::kPushMethod,
                      frame(0, 1, proto::DTYPE_BF16, halves({0x3e80, 0x3e80})), &reply)
                  .ok());
  ASSERT_TRUE(Push(1, 0, {1, 1}).ok());
  EXPECT_EQ(server_->version(), 1);
  EXPECT_EQ(PullAll(), (std::vector<float>{0, 1.5f, 1, 5, 4.75f, 5.75f, 6, 7}));
  // A pull in BF16: two bytes per element, the fp32 values rounded.
  proto::PullRequest pull;
  pull.set_version(1);
  pull.set_dtype(proto::DTYPE_BF16);
  proto::ChunkId* id = pull.add_chunks();
  id->set_key(1);
  id->set_chunk(0);
  grpc::ByteBuffer pulled;
  ASSERT_TRUE(RawCall(proto::kPullMethod, proto::SerializeMessage(pull), &pulled).ok());
  proto::PullReply header;
  auto reader = proto::FrameReader::Open(pulled, "pull reply", &header);
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_TRUE(reader->Split(header.chunks()).ok());
  ASSERT_EQ(header.chunks_size(), 1);
  EXPECT_EQ(header.chunks(0).dtype(), proto::DTYPE_BF16);
  EXPECT_EQ(header.chunks(0).data_bytes(), 4);
  std::string bytes;
  for (absl::string_view piece : reader->pieces(0)) bytes.append(piece.data(), piece.size());
  EXPECT_EQ(bytes, halves({0x40c0, 0x40e0}));  // 6 and 7
  pull.set_dtype(static_cast<proto::DType>(9));
  EXPECT_EQ(RawCall(proto::kPullMethod, proto::SerializeMessage(pull), &pulled).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

// A top-k push: (index, value) pairs decoded into the chunk's dense length
// (zeros elsewhere) before the sum; malformed pairs are refused by their
// problem and change nothing.
TEST_F(GrpcServiceTest, TopKPushesAreDecodedAndMalformedOnesRefused) {
  ASSERT_TRUE(Register("a").ok());
  auto frame = [](int key, int64_t chunk, proto::Encoding encoding, proto::DType dtype,
                  std::vector<std::pair<uint32_t, float>> pairs) {
    std::string bytes;
    for (const auto& [i, v] : pairs) {
      bytes.append(reinterpret_cast<const char*>(&i), 4);
      bytes.append(reinterpret_cast<const char*>(&v), 4);
    }
    return OneChunkPush(key, chunk, dtype, encoding, bytes);
  };
  const auto topk = proto::ENCODING_TOPK;
  const auto f32 = proto::DTYPE_F32;
  grpc::ByteBuffer reply;
  const struct {
    grpc::ByteBuffer request;
    grpc::StatusCode code;
    const char* problem;
  } refused[] = {
      {frame(0, 0, topk, f32, {{4, 1.f}}), grpc::StatusCode::INVALID_ARGUMENT, "out of range"},
      {frame(0, 0, topk, f32, {{2, 1.f}, {1, 1.f}}), grpc::StatusCode::INVALID_ARGUMENT,
       "strictly ascending"},
      {frame(0, 0, topk, f32, {{1, INFINITY}}), grpc::StatusCode::INVALID_ARGUMENT, "not finite"},
      {frame(0, 0, topk, proto::DTYPE_F16, {{1, 1.f}}), grpc::StatusCode::INVALID_ARGUMENT,
       "nothing else sparse"},
      {frame(0, 0, static_cast<proto::Encoding>(7), f32, {{1, 1.f}}),
       grpc::StatusCode::INVALID_ARGUMENT, "encoding 7"},
      // A delta is a pull reply's encoding, never a push's.
      {frame(0, 0, proto::ENCODING_DELTA, f32, {{1, 1.f}}), grpc::StatusCode::INVALID_ARGUMENT,
       "encoding 2"},
      {frame(5, 0, topk, f32, {{1, 1.f}}), grpc::StatusCode::OUT_OF_RANGE, "no such chunk"},
      // One chunk named again and again, each entry a few header bytes that
      // would decode into the chunk's whole length: refused by the count
      // before any of it is allocated.
      {[] {
         proto::PushRequest request;
         request.set_rank(0);
         request.set_num_samples(1);
         for (int i = 0; i < 100000; ++i) {
           proto::TensorChunk* c = request.add_chunks();
           c->set_key(0);
           c->set_chunk(0);
           c->set_encoding(proto::ENCODING_TOPK);
         }
         return proto::MakeFrame(request, {});
       }(),
       grpc::StatusCode::INVALID_ARGUMENT, "decodes to more than 4 elements in one message"},
  };
  for (const auto& r : refused) {
    const grpc::Status s = RawCall(proto::kPushMethod, r.request, &reply);
    EXPECT_EQ(s.error_code(), r.code) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(r.problem));
  }
  EXPECT_EQ(PullAll(), (std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}));
  // Two of chunk (0, 0)'s four elements, one of (0, 1)'s two, none of the
  // bias: lr 1, one sample.
  ASSERT_TRUE(
      RawCall(proto::kPushMethod, frame(0, 0, topk, f32, {{1, 0.5f}, {3, -2.f}}), &reply).ok());
  ASSERT_TRUE(RawCall(proto::kPushMethod, frame(0, 1, topk, f32, {{0, 1.f}}), &reply).ok());
  ASSERT_TRUE(RawCall(proto::kPushMethod, frame(1, 0, topk, f32, {{1, 0.f}}), &reply).ok());
  EXPECT_EQ(server_->version(), 1);
  EXPECT_EQ(PullAll(), (std::vector<float>{1, 1.5f, 3, 6, 4, 6, 7, 8}));
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

TEST_F(GrpcServiceTest, ManyWaitingPullsPinNoThreadAndAllCompleteOnceTheirChunksArrive) {
  ASSERT_TRUE(Register("a").ok());
  const int baseline_threads = ThreadCount();
  const int64_t baseline_kb = ProcStatus("VmRSS:");
  ASSERT_GT(baseline_threads, 0);
  // 1000 pulls from one client, each for version 1 or 2 of one of four sets
  // of chunks: 125 pulls per (version, set).
  const std::vector<std::vector<std::pair<int, int64_t>>> sets = {
      {{0, 0}}, {{0, 1}}, {{1, 0}}, {{0, 1}, {1, 0}}};
  constexpr int kPulls = 1000;
  std::vector<std::unique_ptr<AsyncPull>> pulls;
  Completions done;
  for (int i = 0; i < kPulls; ++i) {
    pulls.push_back(std::make_unique<AsyncPull>());
    StartPull(pulls.back().get(), sets[(i / 2) % 4], /*version=*/1 + i % 2,
              /*timeout_ms=*/60000, &done);
  }
  ASSERT_TRUE(AwaitWaitingPulls(kPulls)) << service_->waiting_pulls() << " pulls wait";
  const int waiting_threads = ThreadCount();
  std::printf("threads: %d before the pulls, %d while %d pulls wait; resident memory +%lld kB "
              "(client and server)\n",
              baseline_threads, waiting_threads, kPulls,
              static_cast<long long>(ProcStatus("VmRSS:") - baseline_kb));
  EXPECT_LT(waiting_threads, baseline_threads + 50);
  EXPECT_EQ(done.done(), 0);

  // Each push completes exactly the pulls of the chunks it applies: the
  // version-1 pulls of (0, 0), then of (0, 1), then of (1, 0) and of both.
  ASSERT_TRUE(Push(0, 0, {1, 1, 1, 1}).ok());
  ASSERT_TRUE(done.WaitFor(125, absl::Seconds(10)));
  ASSERT_TRUE(Push(0, 1, {1, 1}).ok());
  ASSERT_TRUE(done.WaitFor(250, absl::Seconds(10)));
  EXPECT_EQ(service_->waiting_pulls(), 750);
  ASSERT_TRUE(Push(1, 0, {1, 1}).ok());
  ASSERT_TRUE(done.WaitFor(kPulls / 2, absl::Seconds(10)));
  EXPECT_EQ(service_->waiting_pulls(), kPulls / 2);
  // Then one message of iteration 1 completes the version-2 pulls.
  ASSERT_TRUE(PushMany({{0, 0, {1, 1, 1, 1}}, {0, 1, {1, 1}}, {1, 0, {1, 1}}}, 1).ok());
  ASSERT_TRUE(done.WaitFor(kPulls, absl::Seconds(10)));
  EXPECT_EQ(service_->waiting_pulls(), 0);

  // Version v of (w, b) = {1, ..., 8} - v.
  for (int i = 0; i < kPulls; ++i) {
    ASSERT_TRUE(pulls[i]->status.ok()) << i << ": " << pulls[i]->status.error_message();
    proto::PullReply reply;
    ASSERT_TRUE(ParsePullReply(pulls[i]->frame, &reply).ok());
    const int64_t version = 1 + i % 2;
    EXPECT_EQ(reply.version(), version) << i;
    const auto& ids = sets[(i / 2) % 4];
    ASSERT_EQ(reply.chunks_size(), static_cast<int>(ids.size())) << i;
    for (size_t c = 0; c < ids.size(); ++c) {
      const int64_t first = ids[c].first == 0 ? ids[c].second * 4 : 6;
      const std::vector<float> values = Values(reply.chunks(c));
      for (size_t e = 0; e < values.size(); ++e) {
        EXPECT_EQ(values[e], static_cast<float>(first + static_cast<int64_t>(e) + 1 - version)) << i;
      }
    }
  }
}

TEST_F(GrpcServiceTest, AWaitingPullPastItsTimeoutGetsDeadlineExceededNamingTheChunk) {
  ASSERT_TRUE(Register("a").ok());
  // The later pull has the nearer deadline: the deadline thread wakes for it.
  AsyncPull patient, hasty;
  Completions patient_done, hasty_done;
  StartPull(&patient, {{0, 0}}, 1, /*timeout_ms=*/30000, &patient_done);
  ASSERT_TRUE(AwaitWaitingPulls(1));
  const absl::Time start = absl::Now();
  StartPull(&hasty, {{1, 0}}, 1, /*timeout_ms=*/200, &hasty_done);
  ASSERT_TRUE(hasty_done.WaitFor(1, absl::Seconds(10)));
  const absl::Duration waited = absl::Now() - start;
  EXPECT_EQ(hasty.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_THAT(hasty.status.error_message(),
              HasSubstr("version 1 of chunk 0 of 'b' not reached before the deadline; the chunk "
                        "is at version 0"));
  EXPECT_GE(waited, absl::Milliseconds(190));
  EXPECT_LT(waited, absl::Seconds(5));
  EXPECT_EQ(service_->waiting_pulls(), 1);
  EXPECT_EQ(patient_done.done(), 0);

  // The other still waits and gets its chunk once it is pushed.
  ASSERT_TRUE(Push(0, 0, {1, 1, 1, 1}).ok());
  ASSERT_TRUE(patient_done.WaitFor(1, absl::Seconds(10)));
  ASSERT_TRUE(patient.status.ok()) << patient.status.error_message();
  proto::PullReply reply;
  ASSERT_TRUE(ParsePullReply(patient.frame, &reply).ok());
  EXPECT_EQ(Values(reply.chunks(0)), (std::vector<float>{0, 1, 2, 3}));
}

TEST_F(GrpcServiceTest, ShutdownAnswersEveryWaitingPullPromptly) {
  ASSERT_TRUE(Register("a").ok());
  constexpr int kPulls = 50;
  std::vector<std::unique_ptr<AsyncPull>> pulls;
  Completions done;
  for (int i = 0; i < kPulls; ++i) {
    pulls.push_back(std::make_unique<AsyncPull>());
    StartPull(pulls.back().get(), {{1, 0}}, 1, /*timeout_ms=*/60000, &done);
  }
  ASSERT_TRUE(AwaitWaitingPulls(kPulls));
  const absl::Time start = absl::Now();
  service_->Shutdown();
  ASSERT_TRUE(done.WaitFor(kPulls, absl::Seconds(5)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  for (const auto& pull : pulls) {
    EXPECT_EQ(pull->status.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_THAT(pull->status.error_message(), HasSubstr("server shutting down"));
  }
  EXPECT_EQ(service_->waiting_pulls(), 0);
  // A pull that would wait is refused at once; one that need not is answered.
  proto::PullReply reply;
  grpc::Status s = Pull({{1, 0}}, &reply, 1, 60000);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_TRUE(Pull({{1, 0}}, &reply, 0).ok());
  service_->Shutdown();  // idempotent; TearDown's server shutdown then returns at once
}

TEST_F(GrpcServiceTest, AServerShutdownWithADeadlineCancelsWaitingPulls) {
  // As the daemon shuts down: no service Shutdown first; the server's
  // cancellations at its deadline reach the waiting pulls through OnCancel.
  ASSERT_TRUE(Register("a").ok());
  constexpr int kPulls = 20;
  std::vector<std::unique_ptr<AsyncPull>> pulls;
  Completions done;
  for (int i = 0; i < kPulls; ++i) {
    pulls.push_back(std::make_unique<AsyncPull>());
    StartPull(pulls.back().get(), {{0, i % 2}}, 1, /*timeout_ms=*/60000, &done);
  }
  ASSERT_TRUE(AwaitWaitingPulls(kPulls));
  const absl::Time start = absl::Now();
  grpc_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(100));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  ASSERT_TRUE(done.WaitFor(kPulls, absl::Seconds(5)));
  for (const auto& pull : pulls) EXPECT_FALSE(pull->status.ok());
  EXPECT_EQ(service_->waiting_pulls(), 0);
}

TEST_F(GrpcServiceTest, ACancelledPullIsDroppedAtOnce) {
  ASSERT_TRUE(Register("a").ok());
  AsyncPull pull;
  Completions done;
  StartPull(&pull, {{1, 0}}, 1, /*timeout_ms=*/60000, &done);
  ASSERT_TRUE(AwaitWaitingPulls(1));
  pull.context.TryCancel();
  ASSERT_TRUE(done.WaitFor(1, absl::Seconds(5)));
  EXPECT_EQ(pull.status.error_code(), grpc::StatusCode::CANCELLED);
  // The server drops it (OnCancel), long before its deadline.
  ASSERT_TRUE(AwaitWaitingPulls(0));
  // And the chunk's push afterwards answers nobody, harmlessly.
  ASSERT_TRUE(Push(1, 0, {1, 1}).ok());
}

class GrpcServiceCapTest : public GrpcServiceTest {
 protected:
  void SetUp() override { StartServer(/*max_waiting_pulls=*/3); }
};

TEST_F(GrpcServiceCapTest, PullsBeyondTheCapAreRefusedNamingIt) {
  ASSERT_TRUE(Register("a").ok());
  AsyncPull pulls[3];
  Completions done;
  for (AsyncPull& pull : pulls) StartPull(&pull, {{1, 0}}, 1, 60000, &done);
  ASSERT_TRUE(AwaitWaitingPulls(3));
  proto::PullReply reply;
  grpc::Status s = Pull({{0, 0}}, &reply, 1, 60000);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("max_waiting_pulls = 3"));
  // Pulls answered at once are not capped.
  EXPECT_TRUE(Pull({{0, 0}}, &reply, 0).ok());
  ASSERT_TRUE(Push(1, 0, {1, 1}).ok());
  ASSERT_TRUE(done.WaitFor(3, absl::Seconds(10)));
  for (const AsyncPull& pull : pulls) EXPECT_TRUE(pull.status.ok()) << pull.status.error_message();
}

// The credentials (parameter_server.proto, "Credentials"): a server of two
// workers with a job token. Each call states its token and session itself.
class GrpcServiceCredentialsTest : public GrpcServiceTest {
 protected:
  // The wire's metadata key, spelled out: the test checks the contract, not
  // a constant shared with the server.
  static constexpr char kTokenKey[] = "ps-job-token";
  static constexpr char kToken[] = "job-token-0123456789abcdef";

  struct Credentials {
    std::string token;    // "": no ps-job-token metadata
    std::string session;  // "": no ps-session metadata
  };

  void SetUp() override {
    ParameterServerOptions options = Options();
    auto server = ParameterServer::Create(options, Signature(), {1, 2, 3, 4, 5, 6, 7, 8}, &device_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(server).value();
    ServiceOptions service_options;
    service_options.job_token = kToken;
    service_ = std::make_unique<ParameterServerService>(server_.get(), service_options);
    ASSERT_NO_FATAL_FAILURE(Serve(service_.get(), &grpc_server_, &stub_, &raw_stub_));
  }

  static ParameterServerOptions Options() {
    ParameterServerOptions options;
    options.num_workers = 2;
    options.chunk_elements = 4;
    options.optimizer.sgd.lr = 1.f;
    return options;
  }
  static std::vector<ParamSpec> Signature() {
    return {{"w", {6}, DType::kF32}, {"b", {2}, DType::kF32}};
  }

  static void AddCredentials(const Credentials& c, grpc::ClientContext* context) {
    if (!c.token.empty()) context->AddMetadata(kTokenKey, c.token);
    if (!c.session.empty()) context->AddMetadata(proto::kSessionMetadataKey, c.session);
  }

  // Registers as `id` with its secret (`proof`; by default the id's own),
  // the trailing metadata's retry hint in *retry_hint when given.
  grpc::Status RegisterWith(const Credentials& c, const std::string& id,
                            proto::RegisterReply* reply,
                            std::optional<std::string> proof = std::nullopt,
                            std::string* retry_hint = nullptr) {
    proto::RegisterRequest request;
    request.set_worker_id(id);
    request.set_identity_proof(proof.value_or(id + "'s secret"));
    for (const ParamSpec& spec : Signature()) {
      proto::TensorSpec* t = request.add_signature();
      t->set_name(spec.name);
      for (int64_t d : spec.shape) t->add_shape(d);
    }
    grpc::ClientContext context;
    AddCredentials(c, &context);
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::Status status = stub_->Register(&context, request, reply);
    if (retry_hint != nullptr) {
      const auto& trailing = context.GetServerTrailingMetadata();
      auto it = trailing.find(proto::kRetryRegisterMetadataKey);
      *retry_hint = it == trailing.end() ? "" : std::string(it->second.data(), it->second.size());
    }
    return status;
  }

  grpc::Status WaitWith(const Credentials& c, int64_t version) {
    proto::WaitRequest request;
    request.set_version(version);
    request.set_timeout_ms(1000);
    grpc::ClientContext context;
    AddCredentials(c, &context);
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    proto::WaitReply reply;
    return stub_->Wait(&context, request, &reply);
  }

  grpc::Status RawCallWith(const Credentials& c, const char* method,
                           const grpc::ByteBuffer& request, grpc::ByteBuffer* reply) {
    grpc::ClientContext context;
    AddCredentials(c, &context);
    return BlockingRawCall(*raw_stub_, &context, method, request, reply);
  }

  // Rank `rank`'s whole gradient of `iteration` (one sample), every element
  // `value`, in the two messages the 4-element chunks need.
  grpc::Status PushAllWith(const Credentials& c, int rank, int64_t iteration, float value) {
    const std::vector<std::vector<ChunkSpec>> messages = {
        {{0, 0, std::vector<float>(4, value)}},
        {{0, 1, std::vector<float>(2, value)}, {1, 0, std::vector<float>(2, value)}}};
    for (const std::vector<ChunkSpec>& chunks : messages) {
      grpc::ByteBuffer reply;
      grpc::Status s = RawCallWith(c, proto::kPushMethod, RankFrame<proto::PushRequest>(
                                                              chunks, rank, iteration), &reply);
      if (!s.ok()) return s;
    }
    return grpc::Status::OK;
  }

  grpc::Status InitializeWith(const Credentials& c, int rank) {
    grpc::ByteBuffer reply;
    return RawCallWith(c, proto::kInitializeMethod,
                       RankFrame<proto::InitializeRequest>({{1, 0, {9, 9}}}, rank, 0), &reply);
  }

  grpc::Status PullWith(const Credentials& c, int64_t version, proto::PullReply* reply) {
    grpc::ByteBuffer frame;
    grpc::Status s = RawCallWith(c, proto::kPullMethod,
                                 PullRequestBytes({{0, 1}, {1, 0}}, version, 1000), &frame);
    if (!s.ok()) return s;
    return ParsePullReply(frame, reply);
  }

  // A push or initial-value frame of `rank` (PushRequest's iteration and
  // sample count set for a push).
  template <typename Header>
  static grpc::ByteBuffer RankFrame(const std::vector<ChunkSpec>& chunks, int rank,
                                    int64_t iteration) {
    Header header;
    header.set_rank(rank);
    if constexpr (std::is_same_v<Header, proto::PushRequest>) {
      header.set_iteration(iteration);
      header.set_num_samples(1);
    }
    std::vector<grpc::Slice> data;
    for (const ChunkSpec& c : chunks) {
      proto::TensorChunk* chunk = header.add_chunks();
      chunk->set_key(c.key);
      chunk->set_chunk(c.chunk);
      chunk->set_dtype(c.dtype);
      chunk->set_data_bytes(static_cast<int64_t>(c.values.size() * sizeof(float)));
      data.emplace_back(c.values.data(), c.values.size() * sizeof(float));
    }
    return proto::MakeFrame(header, data);
  }

  // Version `version`'s parameters, read from the domain object directly.
  std::vector<float> ParametersAt(int64_t version) {
    std::vector<float> out(8);
    EXPECT_TRUE(server::Pull(*server_, version, absl::InfiniteFuture(), absl::MakeSpan(out)).ok());
    return out;
  }
};

TEST_F(GrpcServiceCredentialsTest, EveryMethodRefusesAMissingOrWrongJobTokenAndChangesNothing) {
  const std::vector<float> initial = {1, 2, 3, 4, 5, 6, 7, 8};
  struct Case {
    const char* what;
    Credentials credentials;
    const char* message;
  };
  const std::vector<Case> strangers = {
      {"no token", {"", ""}, "this server needs the job token (metadata ps-job-token"},
      {"wrong token", {"job-token-0123456789abcdeX", ""}, "wrong job token"},
  };
  auto expect_refused = [](const grpc::Status& s, const Case& c, const char* method) {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << c.what << ", " << method;
    EXPECT_THAT(s.error_message(), HasSubstr(c.message)) << c.what << ", " << method;
  };

  // 1. Before anyone has registered: every method, "x" and "a" registering.
  for (const Case& c : strangers) {
    proto::RegisterReply registered;
    expect_refused(RegisterWith(c.credentials, "x", &registered), c, "Register x");
    expect_refused(RegisterWith(c.credentials, "a", &registered), c, "Register a");
    expect_refused(InitializeWith(c.credentials, 0), c, "Initialize");
    expect_refused(PushAllWith(c.credentials, 0, 0, 100), c, "Push");
    expect_refused(WaitWith(c.credentials, 0), c, "Wait");
    proto::PullReply pulled;
    expect_refused(PullWith(c.credentials, 0, &pulled), c, "Pull");
  }
  EXPECT_EQ(server_->version(), 0);
  EXPECT_EQ(ParametersAt(0), initial);

  // 2. With the right token "a" registers as the first worker: neither
  //    refused Register took a rank. Then "b", and no third.
  proto::RegisterReply a, b, c;
  ASSERT_TRUE(RegisterWith({kToken, ""}, "a", &a).ok());
  EXPECT_EQ(a.rank(), 0);
  EXPECT_EQ(a.num_workers(), 2);
  ASSERT_TRUE(RegisterWith({kToken, ""}, "b", &b).ok());
  EXPECT_EQ(b.rank(), 1);
  EXPECT_EQ(RegisterWith({kToken, ""}, "c", &c).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);

  // 3. A valid session without the token is refused just the same, before
  //    the session is looked at, and a re-registration without the token
  //    does not replace "a"'s session.
  for (const Case& stranger : strangers) {
    const Credentials with_session{stranger.credentials.token, a.session()};
    proto::RegisterReply registered;
    expect_refused(RegisterWith(with_session, "a", &registered), stranger, "Register a again");
    expect_refused(InitializeWith(with_session, 0), stranger, "Initialize (registered)");
    expect_refused(PushAllWith(with_session, 0, 0, 100), stranger, "Push (registered)");
    expect_refused(WaitWith(with_session, 0), stranger, "Wait (registered)");
    proto::PullReply pulled;
    expect_refused(PullWith(with_session, 0, &pulled), stranger, "Pull (registered)");
  }
  EXPECT_EQ(server_->version(), 0);
  EXPECT_EQ(ParametersAt(0), initial);

  // 4. With the token every method works, and the update holds only the
  //    two workers' gradients (1 and 3 per element over 2 samples: 2).
  EXPECT_TRUE(WaitWith({kToken, a.session()}, 0).ok());
  proto::PullReply pulled;
  ASSERT_TRUE(PullWith({kToken, a.session()}, 0, &pulled).ok());
  EXPECT_EQ(pulled.version(), 0);
  EXPECT_EQ(Values(pulled.chunks(0)), (std::vector<float>{5, 6}));
  // The server has its initial parameters: a valid Initialize gets past the
  // credentials to the domain's refusal.
  EXPECT_EQ(InitializeWith({kToken, a.session()}, 0).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  ASSERT_TRUE(PushAllWith({kToken, a.session()}, 0, 0, 1).ok());
  ASSERT_TRUE(PushAllWith({kToken, b.session()}, 1, 0, 3).ok());
  EXPECT_TRUE(WaitWith({kToken, b.session()}, 1).ok());
  EXPECT_EQ(server_->version(), 1);
  EXPECT_EQ(ParametersAt(1), (std::vector<float>{-1, 0, 1, 2, 3, 4, 5, 6}));
  ASSERT_TRUE(PullWith({kToken, b.session()}, 1, &pulled).ok());
  EXPECT_EQ(pulled.version(), 1);
  EXPECT_EQ(Values(pulled.chunks(1)), (std::vector<float>{5, 6}));
}

TEST_F(GrpcServiceCredentialsTest, EachWorkerActsOnlyWithItsOwnSessionOfThisServer) {
  proto::RegisterReply a, b;
  ASSERT_TRUE(RegisterWith({kToken, ""}, "a", &a).ok());
  ASSERT_TRUE(RegisterWith({kToken, ""}, "b", &b).ok());
  ASSERT_EQ(a.rank(), 0);
  ASSERT_EQ(b.rank(), 1);
  EXPECT_NE(a.session(), b.session());
  // A session of another server process: a second ParameterServer's
  // registration of the same worker.
  CpuDevice other_device{0, 1};
  auto other =
      ParameterServer::Create(Options(), Signature(), {1, 2, 3, 4, 5, 6, 7, 8}, &other_device);
  ASSERT_TRUE(other.ok()) << other.status();
  auto elsewhere = (*other)->Register("a", Signature());
  ASSERT_TRUE(elsewhere.ok()) << elsewhere.status();
  ASSERT_NE(elsewhere->session, a.session());

  // 1. Worker 0 pushing with worker 1's session, with none, with another
  //    server's: refused, nothing summed.
  grpc::Status s = PushAllWith({kToken, b.session()}, 0, 0, 100);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(s.error_message(), HasSubstr("the session credential is not rank 0's"));
  EXPECT_EQ(InitializeWith({kToken, b.session()}, 0).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  s = PushAllWith({kToken, ""}, 0, 0, 100);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(s.error_message(), HasSubstr("no session credential"));
  s = PushAllWith({kToken, elsewhere->session}, 0, 0, 100);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(s.error_message(), HasSubstr("a session of another server process"));
  EXPECT_EQ(server_->version(), 0);

  // 2. The iteration finished legitimately holds only the workers' own
  //    gradients: (1 + 3) / 2 samples = 2 per element.
  ASSERT_TRUE(PushAllWith({kToken, a.session()}, 0, 0, 1).ok());
  ASSERT_TRUE(PushAllWith({kToken, b.session()}, 1, 0, 3).ok());
  EXPECT_EQ(server_->version(), 1);
  EXPECT_EQ(ParametersAt(1), (std::vector<float>{-1, 0, 1, 2, 3, 4, 5, 6}));

  // 3. Pulls (and waits) check only the incarnation: another server's
  //    session is ABORTED, none is fine.
  proto::PullReply pulled;
  s = PullWith({kToken, elsewhere->session}, 1, &pulled);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(s.error_message(), HasSubstr("a session of another server process"));
  EXPECT_EQ(WaitWith({kToken, elsewhere->session}, 1).error_code(), grpc::StatusCode::ABORTED);
  ASSERT_TRUE(PullWith({kToken, ""}, 1, &pulled).ok());
  EXPECT_EQ(pulled.version(), 1);
  EXPECT_EQ(Values(pulled.chunks(0)), (std::vector<float>{3, 4}));
  EXPECT_TRUE(WaitWith({kToken, ""}, 1).ok());

  // 4. A worker that registers again gets a new session, and its old one
  //    stops working.
  proto::RegisterReply b_again;
  ASSERT_TRUE(RegisterWith({kToken, ""}, "b", &b_again).ok());
  EXPECT_EQ(b_again.rank(), 1);
  EXPECT_NE(b_again.session(), b.session());
  s = PushAllWith({kToken, b.session()}, 1, 1, 100);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(s.error_message(), HasSubstr("worker 'b' registered it since"));
  ASSERT_TRUE(PushAllWith({kToken, b_again.session()}, 1, 1, 3).ok());
  ASSERT_TRUE(PushAllWith({kToken, a.session()}, 0, 1, 1).ok());
  EXPECT_EQ(server_->version(), 2);
  EXPECT_EQ(ParametersAt(2), (std::vector<float>{-3, -2, -1, 0, 1, 2, 3, 4}));
}

// Token only: a stranger with the job token cannot take a live worker's
// id (ALREADY_EXISTS naming it, with the retry hint); the worker itself,
// restarted with its secret, takes its rank back at once.
TEST_F(GrpcServiceCredentialsTest, ALiveWorkersIdNeedsItsProof) {
  proto::RegisterReply a, b;
  ASSERT_TRUE(RegisterWith({kToken, ""}, "a", &a).ok());
  ASSERT_TRUE(RegisterWith({kToken, ""}, "b", &b, "").ok());
  EXPECT_EQ(a.identity(), "proof");
  EXPECT_EQ(b.identity(), "token");
  for (const std::string& proof : {std::string(), std::string("a guess")}) {
    proto::RegisterReply stolen;
    std::string hint;
    const grpc::Status s = RegisterWith({kToken, ""}, "a", &stolen, proof, &hint);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::ALREADY_EXISTS) << proof;
    EXPECT_THAT(s.error_message(), HasSubstr("worker 'a' is live: rank 0's holder was heard "));
    EXPECT_THAT(s.error_message(), HasSubstr("within the liveness timeout of 10s"));
    EXPECT_EQ(hint, "live worker");
  }
  // b registered without a secret: nothing proves it until it is lost.
  proto::RegisterReply stolen;
  EXPECT_EQ(RegisterWith({kToken, ""}, "b", &stolen, "").error_code(),
            grpc::StatusCode::ALREADY_EXISTS);
  // A rank held by another id is refused without the hint (waiting does
  // not help).
  std::string hint = "unset";
  EXPECT_EQ(RegisterWith({kToken, ""}, "c", &stolen, "", &hint).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(hint, "");
  // Nothing changed: both sessions still push.
  ASSERT_TRUE(PushAllWith({kToken, a.session()}, 0, 0, 1).ok());
  ASSERT_TRUE(PushAllWith({kToken, b.session()}, 1, 0, 3).ok());
  EXPECT_EQ(server_->version(), 1);
  // The real a, restarted with its secret: its rank at once.
  proto::RegisterReply a_again;
  ASSERT_TRUE(RegisterWith({kToken, ""}, "a", &a_again).ok());
  EXPECT_EQ(a_again.rank(), 0);
}

// Restore and the job run: the first proposal of a run is adopted and
// told to every later registration; a Restore is refused without its
// rank's session, for a negative version or one past the server's (each
// with its code, changing nothing), answered OK at once at the current
// version, and handed to the owner's hook (whose answer is the call's)
// below it.
class GrpcServiceRestoreTest : public GrpcServiceCredentialsTest {
 protected:
  void SetUp() override {
    auto server = ParameterServer::Create(Options(), Signature(), {1, 2, 3, 4, 5, 6, 7, 8}, &device_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(server).value();
    ServiceOptions service_options;
    service_options.job_token = kToken;
    service_options.job_run = &job_run_;
    service_options.restore = [this](int64_t version, std::function<void(absl::Status)> done) {
      asked_.push_back(version);
      done(absl::FailedPreconditionError("the hook's answer"));
    };
    service_ = std::make_unique<ParameterServerService>(server_.get(), service_options);
    ASSERT_NO_FATAL_FAILURE(Serve(service_.get(), &grpc_server_, &stub_, &raw_stub_));
  }

  grpc::Status RestoreWith(const Credentials& c, int rank, int64_t version) {
    proto::RestoreRequest request;
    request.set_rank(rank);
    request.set_version(version);
    grpc::ClientContext context;
    AddCredentials(c, &context);
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    proto::RestoreReply reply;
    grpc::Status status = stub_->Restore(&context, request, &reply);
    if (status.ok()) {
      EXPECT_EQ(reply.version(), version);
    }
    return status;
  }

  JobRun job_run_;
  std::vector<int64_t> asked_;
};

TEST_F(GrpcServiceRestoreTest, TheJobRunIsAdoptedOnceAndHostileRestoresChangeNothing) {
  proto::RegisterReply a, b;
  ASSERT_TRUE(RegisterWith({kToken, ""}, "a", &a).ok());
  EXPECT_EQ(a.job_run(), "");  // none proposed, none yet
  proto::RegisterRequest request;
  request.set_worker_id("b");
  for (const ParamSpec& spec : Signature()) {
    proto::TensorSpec* t = request.add_signature();
    t->set_name(spec.name);
    for (int64_t d : spec.shape) t->add_shape(d);
  }
  request.set_identity_proof("b's secret");  // its second registration proves it is b
  request.set_job_run("run-1");
  {
    grpc::ClientContext context;
    AddCredentials({kToken, ""}, &context);
    ASSERT_TRUE(stub_->Register(&context, request, &b).ok());
  }
  EXPECT_EQ(b.job_run(), "run-1");
  request.set_job_run("run-2");
  {
    grpc::ClientContext context;
    AddCredentials({kToken, ""}, &context);
    ASSERT_TRUE(stub_->Register(&context, request, &b).ok());
  }
  EXPECT_EQ(b.job_run(), "run-1");  // kept: another run is not adopted
  EXPECT_EQ(job_run_.id(), "run-1");

  ASSERT_TRUE(PushAllWith({kToken, a.session()}, 0, 0, 1).ok());
  ASSERT_TRUE(PushAllWith({kToken, b.session()}, 1, 0, 3).ok());
  ASSERT_EQ(server_->version(), 1);
  const std::vector<float> before = ParametersAt(1);

  EXPECT_EQ(RestoreWith({"", a.session()}, 0, 0).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(RestoreWith({kToken, ""}, 0, 0).error_code(), grpc::StatusCode::ABORTED);
  EXPECT_EQ(RestoreWith({kToken, b.session()}, 0, 0).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(RestoreWith({kToken, a.session()}, 7, 0).error_code(), grpc::StatusCode::NOT_FOUND);
  grpc::Status s = RestoreWith({kToken, a.session()}, 0, -1);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("versions start at 0"));
  s = RestoreWith({kToken, a.session()}, 0, 2);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_THAT(s.error_message(), HasSubstr("past this server's 1"));
  EXPECT_TRUE(asked_.empty());
  // At the current version already: OK, nothing asked of the owner.
  EXPECT_TRUE(RestoreWith({kToken, b.session()}, 1, 1).ok());
  EXPECT_TRUE(asked_.empty());
  // Below it: the owner decides.
  s = RestoreWith({kToken, a.session()}, 0, 0);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(s.error_message(), "the hook's answer");
  EXPECT_EQ(asked_, (std::vector<int64_t>{0}));
  EXPECT_EQ(server_->version(), 1);
  EXPECT_EQ(ParametersAt(1), before);
}

// Without a restore hook (no checkpoint directory) a restore below the
// current version is FAILED_PRECONDITION saying so.
TEST_F(GrpcServiceCredentialsTest, ARestoreWithoutCheckpointsIsRefusedSayingSo) {
  proto::RegisterReply a;
  ASSERT_TRUE(RegisterWith({kToken, ""}, "a", &a).ok());
  EXPECT_EQ(a.job_run(), "");
  proto::RegisterReply b;
  ASSERT_TRUE(RegisterWith({kToken, ""}, "b", &b).ok());
  ASSERT_TRUE(PushAllWith({kToken, a.session()}, 0, 0, 1).ok());
  ASSERT_TRUE(PushAllWith({kToken, b.session()}, 1, 0, 3).ok());
  proto::RestoreRequest request;
  request.set_rank(0);
  request.set_version(0);
  grpc::ClientContext context;
  AddCredentials({kToken, a.session()}, &context);
  proto::RestoreReply reply;
  const grpc::Status s = stub_->Restore(&context, request, &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("keeps no checkpoints"));
  EXPECT_EQ(server_->version(), 1);
}

// Stale synchronous parallel over the wire: the registration says
// "ssp:1", a push past the bound is OUT_OF_RANGE naming it, a push reply
// carries its staleness (iteration - based_on_version, also told to
// on_staleness), the step-t pull (version t - S) waits for the slow rank's
// push and is answered by it, and heartbeats say at which step each rank is.
class GrpcServiceSspTest : public GrpcServiceCredentialsTest {
 protected:
  void SetUp() override {
    ParameterServerOptions options = Options();
    options.consistency = ParseConsistency("ssp:1").value();
    auto server = ParameterServer::Create(options, Signature(), {1, 2, 3, 4, 5, 6, 7, 8}, &device_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(server).value();
    ServiceOptions service_options;
    service_options.on_staleness = [this](int64_t staleness) {
      absl::MutexLock lock(&staleness_mu_);
      staleness_.push_back(staleness);
    };
    service_ = std::make_unique<ParameterServerService>(server_.get(), service_options);
    ASSERT_NO_FATAL_FAILURE(Serve(service_.get(), &grpc_server_, &stub_, &raw_stub_));
  }

  // Rank `rank`'s whole gradient of `iteration` (every element 1, one
  // sample) in one message, computed from version `based_on`; the reply's
  // staleness into *staleness.
  grpc::Status PushWhole(const std::string& session, int rank, int64_t iteration,
                         int64_t based_on, int64_t* staleness = nullptr) {
    proto::PushRequest header;
    header.set_rank(rank);
    header.set_iteration(iteration);
    header.set_num_samples(1);
    header.set_based_on_version(based_on);
    const std::vector<float> ones(4, 1.f);
    std::vector<grpc::Slice> data;
    for (const auto& [key, chunk, n] :
         std::vector<std::tuple<int, int64_t, size_t>>{{0, 0, 4}, {0, 1, 2}, {1, 0, 2}}) {
      proto::TensorChunk* c = header.add_chunks();
      c->set_key(key);
      c->set_chunk(chunk);
      c->set_data_bytes(static_cast<int64_t>(n * sizeof(float)));
      data.emplace_back(ones.data(), n * sizeof(float));
    }
    grpc::ByteBuffer reply;
    grpc::Status s =
        RawCallWith({"", session}, proto::kPushMethod, proto::MakeFrame(header, data), &reply);
    if (s.ok() && staleness != nullptr) {
      proto::PushReply message;
      EXPECT_TRUE(proto::ParseMessage(reply, "push reply", &message).ok());
      *staleness = message.staleness();
    }
    return s;
  }

  absl::Mutex staleness_mu_;
  std::vector<int64_t> staleness_ ABSL_GUARDED_BY(staleness_mu_);
};

TEST_F(GrpcServiceSspTest, TheBoundHoldsTheFastRanksPullAndRefusesItsPushAhead) {
  proto::RegisterReply a, b;
  ASSERT_TRUE(RegisterWith({}, "a", &a).ok());
  ASSERT_TRUE(RegisterWith({}, "b", &b).ok());
  EXPECT_EQ(a.consistency(), "ssp:1");
  // Rank 0 runs one step ahead: iteration 1 from version 0, one behind.
  int64_t staleness = -1;
  ASSERT_TRUE(PushWhole(a.session(), 0, 0, 0, &staleness).ok());
  EXPECT_EQ(staleness, 0);
  ASSERT_TRUE(PushWhole(a.session(), 0, 1, 0, &staleness).ok());
  EXPECT_EQ(staleness, 1);
  grpc::Status s = PushWhole(a.session(), 0, 2, 0);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_THAT(s.error_message(), HasSubstr("ahead of the ssp:1 bound"));
  EXPECT_THAT(s.error_message(), HasSubstr("waiting for ranks 1"));
  // Its pull for step 2 (version 1) waits for rank 1's push of step 0.
  AsyncPull pull;
  Completions done;
  StartPull(&pull, {{0, 0}}, /*version=*/1, /*timeout_ms=*/60000, &done);
  ASSERT_TRUE(AwaitWaitingPulls(1));
  proto::HeartbeatRequest beat;
  beat.set_rank(0);
  proto::HeartbeatReply where;
  {
    grpc::ClientContext context;
    AddCredentials({"", a.session()}, &context);
    ASSERT_TRUE(stub_->Heartbeat(&context, beat, &where).ok());
  }
  EXPECT_EQ(where.version(), 0);
  EXPECT_THAT(where.rank_steps(), ::testing::ElementsAre(2, 0));
  ASSERT_TRUE(PushWhole(b.session(), 1, 0, 0, &staleness).ok());
  ASSERT_TRUE(done.WaitFor(1, absl::Seconds(10)));
  ASSERT_TRUE(pull.status.ok()) << pull.status.error_message();
  proto::PullReply pulled;
  ASSERT_TRUE(ParsePullReply(pull.frame, &pulled).ok());
  EXPECT_EQ(pulled.version(), 1);
  // lr 1, (1 + 1) / 2 samples: every element down by 1.
  EXPECT_EQ(Values(pulled.chunks(0)), (std::vector<float>{0, 1, 2, 3}));
  ASSERT_TRUE(PushWhole(a.session(), 0, 2, 1, &staleness).ok());
  EXPECT_EQ(staleness, 1);
  absl::MutexLock lock(&staleness_mu_);
  EXPECT_THAT(staleness_, ::testing::ElementsAre(0, 1, 0, 1));
}

// A state capture under ssp:1 holds back the updates of the iteration
// ahead until the boundary; when they are applied then, a pull waiting for
// one of them is answered, though the push that reached the boundary sent
// other chunks.
TEST_F(GrpcServiceSspTest, APullWaitingForAHeldBackUpdateIsAnsweredWhenItIsApplied) {
  proto::RegisterReply a, b;
  ASSERT_TRUE(RegisterWith({}, "a", &a).ok());
  ASSERT_TRUE(RegisterWith({}, "b", &b).ok());
  grpc::ByteBuffer reply;
  auto push = [&](const proto::RegisterReply& who, int rank, int64_t iteration,
                  std::vector<ChunkSpec> chunks) {
    return RawCallWith({"", who.session()}, proto::kPushMethod,
                       RankFrame<proto::PushRequest>(chunks, rank, iteration), &reply);
  };
  const ChunkSpec w0{0, 0, {1, 1, 1, 1}}, w1{0, 1, {1, 1}}, bias{1, 0, {1, 1}};
  ASSERT_TRUE(push(a, 0, 0, {w0, w1, bias}).ok());
  ASSERT_TRUE(push(a, 0, 1, {w0, w1, bias}).ok());
  ASSERT_TRUE(push(b, 1, 0, {bias}).ok());  // iteration 0's bias is updated
  int captures = 0;
  server_->CaptureState([&](ParameterServer::State) { ++captures; });
  EXPECT_EQ(captures, 0);                   // mid-iteration: it waits
  ASSERT_TRUE(push(b, 1, 1, {bias}).ok());  // iteration 1's bias, held back
  AsyncPull pull;
  Completions done;
  StartPull(&pull, {{1, 0}}, /*version=*/2, /*timeout_ms=*/60000, &done);
  ASSERT_TRUE(AwaitWaitingPulls(1));
  ASSERT_TRUE(push(b, 1, 0, {w0, w1}).ok());  // the boundary: captured, then released
  EXPECT_EQ(captures, 1);
  ASSERT_TRUE(done.WaitFor(1, absl::Seconds(10))) << "the pull still waits";
  ASSERT_TRUE(pull.status.ok()) << pull.status.error_message();
  proto::PullReply pulled;
  ASSERT_TRUE(ParsePullReply(pull.frame, &pulled).ok());
  EXPECT_EQ(pulled.version(), 2);
  EXPECT_EQ(service_->waiting_pulls(), 0);
}

// Synchronous, two workers, pushes paced (ServiceOptions::max_push_lead_bytes
// of 8: two elements).
class GrpcServicePacingTest : public GrpcServiceCredentialsTest {
 protected:
  void SetUp() override {
    auto server =
        ParameterServer::Create(Options(), Signature(), {1, 2, 3, 4, 5, 6, 7, 8}, &device_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(server).value();
    ServiceOptions service_options;
    service_options.max_push_lead_bytes = 8;
    service_options.push_lead_idle = kIdle;
    service_options.push_hold_limit = absl::Seconds(30);
    service_ = std::make_unique<ParameterServerService>(server_.get(), service_options);
    ASSERT_NO_FATAL_FAILURE(Serve(service_.get(), &grpc_server_, &stub_, &raw_stub_));
    ASSERT_TRUE(RegisterWith({}, "a", &a_).ok());
    ASSERT_TRUE(RegisterWith({}, "b", &b_).ok());
  }

  // A push in flight of one chunk (every element 1) by `rank`.
  struct AsyncPush {
    grpc::ClientContext context;
    grpc::ByteBuffer request;
    grpc::ByteBuffer reply;
    grpc::Status status;
    absl::Time done_at;
    absl::Notification done;
  };
  void StartPush(AsyncPush* push, int rank, int key, int64_t chunk, int64_t iteration) {
    const size_t n = server_->ChunkLength(key, chunk);
    push->context.AddMetadata(proto::kSessionMetadataKey,
                              rank == 0 ? a_.session() : b_.session());
    push->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    push->request = RankFrame<proto::PushRequest>(
        {{key, chunk, std::vector<float>(n, 1.f)}}, rank, iteration);
    raw_stub_->UnaryCall(&push->context, proto::kPushMethod, grpc::StubOptions(), &push->request,
                         &push->reply, [push](grpc::Status s) {
                           push->status = std::move(s);
                           push->done_at = absl::Now();
                           push->done.Notify();
                         });
  }
  grpc::Status PushNow(int rank, int key, int64_t chunk, int64_t iteration) {
    AsyncPush push;
    StartPush(&push, rank, key, chunk, iteration);
    push.done.WaitForNotification();
    return push.status;
  }

  // Rank 1 pushes 2 elements, rank 0 then 4 (2 ahead: it goes) and starts
  // 2 more as `held` (4 ahead while rank 1 pushes: its reply waits).
  void StartHeldPush(AsyncPush* held) {
    ASSERT_TRUE(PushNow(1, 1, 0, 0).ok());
    ASSERT_TRUE(PushNow(0, 0, 0, 0).ok());
    StartPush(held, 0, 0, 1, 0);
  }

  static constexpr absl::Duration kIdle = absl::Milliseconds(400);
  proto::RegisterReply a_, b_;
};

TEST_F(GrpcServicePacingTest, TheLeadersReplyWaitsUntilThePushingSlowestCatchesUp) {
  AsyncPush held;
  ASSERT_NO_FATAL_FAILURE(StartHeldPush(&held));
  EXPECT_FALSE(held.done.WaitForNotificationWithTimeout(kIdle / 4));
  // Rank 1 catches up (6 each): the held reply goes at once, long before
  // rank 1 would count as idle.
  const absl::Time caught_up = absl::Now();
  ASSERT_TRUE(PushNow(1, 0, 0, 0).ok());
  ASSERT_TRUE(held.done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_TRUE(held.status.ok()) << held.status.error_message();
  EXPECT_LT(held.done_at - caught_up, kIdle / 2);
  // Held or not, the push was summed: once both finish, version 1 is the
  // SGD step of the mean gradient 1 (lr 1).
  ASSERT_TRUE(PushNow(1, 0, 1, 0).ok());
  ASSERT_TRUE(PushNow(0, 1, 0, 0).ok());
  EXPECT_EQ(ParametersAt(1), (std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST_F(GrpcServicePacingTest, ASlowestThatStopsPushingHoldsNobodyPastTheIdleTime) {
  // No earlier than the server's record of rank 1's last push.
  const absl::Time slowest_last = absl::Now();
  AsyncPush held;
  ASSERT_NO_FATAL_FAILURE(StartHeldPush(&held));
  // Rank 1 goes quiet (computing): the reply goes after kIdle, not later.
  ASSERT_TRUE(held.done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_TRUE(held.status.ok()) << held.status.error_message();
  EXPECT_GE(held.done_at - slowest_last, kIdle);
  EXPECT_LT(held.done_at - slowest_last, kIdle + absl::Seconds(2));
  // And with rank 1 idle, rank 0's last push of the iteration goes at once.
  const absl::Time start = absl::Now();
  ASSERT_TRUE(PushNow(0, 1, 0, 0).ok());
  EXPECT_LT(absl::Now() - start, kIdle / 2);
}

TEST_F(GrpcServicePacingTest, ShutdownAnswersHeldPushes) {
  AsyncPush held;
  ASSERT_NO_FATAL_FAILURE(StartHeldPush(&held));
  EXPECT_FALSE(held.done.WaitForNotificationWithTimeout(kIdle / 4));
  service_->Shutdown();
  ASSERT_TRUE(held.done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(held.status.ok()) << held.status.error_message();
}

}  // namespace
}  // namespace ps::server
