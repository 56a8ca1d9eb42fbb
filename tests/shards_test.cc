// The daemons with a sharded model: two server processes and two workers
// given both addresses train to the end, each worker pushing and pulling one
// model's worth per step across the shards, and end with the same weights,
// byte for byte, as the same job on one server. A worker that lists the
// shards in another order is refused by the shard it reaches first, and
// hostile calls to every shard while the job trains are refused, each with
// its code, and change nothing (the weights still match byte for byte),
// restores without a session included.
// Workers moving their tensor bytes through shared memory (--shared_memory)
// end with the same weights too.

#include <signal.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/testing/subprocess.h"
#include "proto/parameter_server.grpc.pb.h"
#include "proto/wire_format.h"
#include "tests/process.h"

namespace ps {
namespace {

using ::testing::HasSubstr;
using tests::Process;
using tests::WaitForLog;
using tests::WaitForPortFile;

constexpr int kSteps = 30;

std::vector<std::string> WorkerArgs(const std::string& servers, int rank,
                                    const std::string& tag) {
  return {"--server=" + servers,
          absl::StrCat("--worker_id=w", rank),
          absl::StrCat("--rank=", rank),
          "--model=mlp",
          "--mlp_hidden=32",
          "--seed=3",
          "--dataset=synthetic",
          "--batch_size=64",
          "--epochs=1",
          absl::StrCat("--max_steps=", kSteps),
          "--devices=cpu",
          "--threads=1",
          "--progress=false",
          "--evaluate=false",
          "--save_weights=" + testing::TestTmpPath(absl::StrCat(tag, "-w", rank, ".safetensors"))};
}

// Runs `shards` servers and two workers to the end; returns worker 0's saved
// weights (empty on failure). `check(workers)` runs once both workers have
// registered, while they train.
std::string RunJob(int shards, const std::string& tag,
                   const std::function<void(const std::vector<std::string>&)>& check = {},
                   bool shared_memory = false) {
  std::vector<std::unique_ptr<Process>> servers;
  std::vector<std::string> addresses;
  for (int s = 0; s < shards; ++s) {
    const std::string port_file = testing::TestTmpPath(absl::StrCat(tag, "-port", s));
    servers.push_back(std::make_unique<Process>(
        testing::RunfilePath("server/server"),
        std::vector<std::string>{"--port=0", "--port_file=" + port_file, "--num_workers=2",
                                 "--lr=0.1", "--momentum=0.9", "--weight_decay=5e-4"},
        testing::TestTmpPath(absl::StrCat(tag, "-server", s, ".log"))));
    const int port = WaitForPortFile(port_file);
    EXPECT_GT(port, 0) << servers.back()->Log();
    if (port <= 0) return "";
    addresses.push_back(absl::StrCat("127.0.0.1:", port));
  }
  const std::string list = absl::StrJoin(addresses, ",");
  std::vector<std::unique_ptr<Process>> workers;
  for (int r = 0; r < 2; ++r) {
    std::vector<std::string> args = WorkerArgs(list, r, tag);
    if (shared_memory) args.push_back("--shared_memory");
    workers.push_back(std::make_unique<Process>(
        testing::RunfilePath("worker/worker"), args,
        testing::TestTmpPath(absl::StrCat(tag, "-worker", r, ".log"))));
  }
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(WaitForLog(*workers[r], absl::StrCat("worker ", r, "/2: training"),
                           std::chrono::seconds(120)))
        << workers[r]->Log();
  }
  if (check) check(addresses);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(workers[r]->Wait(std::chrono::seconds(240)), 0) << workers[r]->Log();
    // One model's worth each way per step, over all shards together.
    EXPECT_THAT(workers[r]->Log(), HasSubstr("pushed 101800 and pulled 101800 bytes per step "
                                             "(model: 101800 bytes)"));
    if (shared_memory) {
      for (const std::string& address : addresses) {
        EXPECT_THAT(workers[r]->Log(),
                    HasSubstr(absl::StrCat("tensor bytes to and from ", address,
                                           " go through shared memory")));
      }
    }
    if (shards > 1) {
      EXPECT_THAT(workers[r]->Log(),
                  HasSubstr(absl::StrCat("optimizer on ", shards, " server shards")));
    }
  }
  for (auto& server : servers) {
    server->Signal(SIGTERM);
    EXPECT_EQ(server->Wait(std::chrono::seconds(20)), 0) << server->Log();
    // Every shard made every update.
    EXPECT_THAT(server->Log(), HasSubstr(absl::StrCat("stopping at version ", kSteps)));
  }
  return testing::ReadFileBytes(testing::TestTmpPath(absl::StrCat(tag, "-w0.safetensors")));
}

// One raw call of `method` with `request` to `address`; its status code.
grpc::StatusCode RawCall(const std::string& address, const char* method,
                         const grpc::ByteBuffer& request) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::CompletionQueue cq;
  grpc::ByteBuffer reply;
  grpc::Status status;
  auto call = stub.PrepareUnaryCall(&context, method, request, &cq);
  call->StartCall();
  call->Finish(&reply, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return status.error_code();
}

grpc::ByteBuffer PushFrame(int rank, int64_t iteration, int key, float value) {
  proto::PushRequest header;
  header.set_rank(rank);
  header.set_iteration(iteration);
  header.set_num_samples(1);
  proto::TensorChunk* chunk = header.add_chunks();
  chunk->set_key(key);
  chunk->set_dtype(proto::DTYPE_F32);
  chunk->set_data_bytes(4);
  static float data;
  data = value;
  std::vector<grpc::Slice> slices = {grpc::Slice(&data, 4)};
  return proto::MakeFrame(header, slices);
}

// Every kind of bad call a shard refuses, sent to each shard of a job in
// training: the codes the protocol lists (proto/parameter_server.proto).
void SendHostileCalls(const std::vector<std::string>& addresses) {
  for (const std::string& address : addresses) {
    SCOPED_TRACE(address);
    // Not a frame at all.
    const std::string junk = "\xff\xff\xff\x7fnot a frame";
    grpc::Slice junk_slice(junk.data(), junk.size());
    EXPECT_EQ(RawCall(address, proto::kPushMethod, grpc::ByteBuffer(&junk_slice, 1)),
              grpc::StatusCode::INVALID_ARGUMENT);
    // Pushes without a session credential, as a rank the job does not have
    // or as a real one for an iteration far from the current one: refused
    // before the frame's contents count (the ranks' own checks run once a
    // session is right: server/grpc_service_test).
    EXPECT_EQ(RawCall(address, proto::kPushMethod, PushFrame(7, 0, 0, 1.f)),
              grpc::StatusCode::ABORTED);
    EXPECT_EQ(RawCall(address, proto::kPushMethod, PushFrame(0, 1 << 30, 0, 1.f)),
              grpc::StatusCode::ABORTED);
    // A pull of a key the model does not have.
    proto::PullRequest pull;
    pull.set_version(0);
    proto::ChunkId* id = pull.add_chunks();
    id->set_key(1000);
    id->set_chunk(0);
    EXPECT_EQ(RawCall(address, proto::kPullMethod, proto::SerializeMessage(pull)),
              grpc::StatusCode::OUT_OF_RANGE);
    // A third worker, and one with another model.
    auto stub = proto::ParameterServer::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    proto::RegisterRequest reg;
    reg.set_worker_id("intruder");
    proto::TensorSpec* t = reg.add_signature();
    t->set_name("x");
    t->set_dtype(proto::DTYPE_F32);
    t->add_shape(3);
    proto::RegisterReply reply;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    const grpc::Status status = stub->Register(&context, reg, &reply);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << status.error_message();
    // Restores without a session: to version 0, to a future one, below 0.
    for (const int64_t version : {int64_t{0}, int64_t{1} << 40, int64_t{-1}}) {
      proto::RestoreRequest restore;
      restore.set_rank(0);
      restore.set_version(version);
      proto::RestoreReply restored;
      grpc::ClientContext restore_context;
      restore_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      const grpc::Status refused = stub->Restore(&restore_context, restore, &restored);
      EXPECT_EQ(refused.error_code(), grpc::StatusCode::ABORTED) << refused.error_message();
    }
  }
}

TEST(ShardsTest, TwoShardProcessesTrainLikeOneServerByteForByte) {
  const std::string one = RunJob(1, "one");
  const std::string two = RunJob(2, "two", [](const std::vector<std::string>& addresses) {
    // The same shards in the other order: the plan's first part reaches the
    // second shard, which holds the other part, and refuses it.
    Process reordered(testing::RunfilePath("worker/worker"),
                      WorkerArgs(addresses[1] + "," + addresses[0], 0, "reordered"),
                      testing::TestTmpPath("reordered.log"));
    EXPECT_EQ(reordered.Wait(std::chrono::seconds(60)), 1);
    EXPECT_THAT(reordered.Log(), HasSubstr("FAILED_PRECONDITION"));
    EXPECT_THAT(reordered.Log(), HasSubstr(absl::StrCat("shard 0 of 2 (", addresses[1], ")")));
    EXPECT_THAT(reordered.Log(), HasSubstr("different model"));
    SendHostileCalls(addresses);
  });
  ASSERT_FALSE(one.empty());
  EXPECT_TRUE(one == two) << "the sharded job's weights differ from one server's";
}

TEST(ShardsTest, SharedMemoryTrainsLikeTcpByteForByte) {
  const std::string tcp = RunJob(1, "tcp");
  const std::string shared_one = RunJob(1, "shm1", {}, /*shared_memory=*/true);
  const std::string shared_two = RunJob(2, "shm2", {}, /*shared_memory=*/true);
  ASSERT_FALSE(tcp.empty());
  EXPECT_TRUE(tcp == shared_one) << "one server: shared memory's weights differ from TCP's";
  EXPECT_TRUE(tcp == shared_two) << "two shards: shared memory's weights differ from TCP's";
}

}  // namespace
}  // namespace ps
