#include "worker/server_check.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/in_process_server.h"

namespace ps::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::vector<ParamSpec> Signature() {
  return {{"fc.weight", {3, 4}, DType::kF32}, {"fc.bias", {3}, DType::kF32}};
}

// A server for two workers holding Signature()'s initial parameters.
std::unique_ptr<server::InProcessServer> StartServer() {
  server::ParameterServerOptions options;
  options.num_workers = 2;
  options.chunk_elements = 8;
  auto server = server::InProcessServer::Start(options, Signature(), std::vector<float>(15, 0.5f));
  EXPECT_TRUE(server.ok()) << server.status();
  return std::move(server).value();
}

ServerCheckOptions OptionsFor(const std::string& address) {
  ServerCheckOptions options;
  options.address = address;
  options.timeout = absl::Seconds(5);
  return options;
}

TEST(ServerCheckTest, AnAddressWithoutAPortFailsAtTheFirstStep) {
  const ServerCheckResult result = CheckServer(OptionsFor("server"));
  EXPECT_FALSE(result.ok);
  EXPECT_THAT(result.lines,
              ElementsAre("FAIL: 'server' is not host:port -- give --server as host:port, e.g. "
                          "10.0.0.5:50051 or server:50051"));
}

TEST(ServerCheckTest, NothingListeningFailsAtTcpAfterTheNameResolves) {
  const ServerCheckResult result = CheckServer(OptionsFor("127.0.0.1:1"));
  EXPECT_FALSE(result.ok);
  ASSERT_EQ(result.lines.size(), 2u) << absl::StrJoin(result.lines, "\n");
  EXPECT_EQ(result.lines[0], "ok: 127.0.0.1 resolves");
  EXPECT_THAT(result.lines[1], StartsWith("FAIL: TCP to 127.0.0.1:1: Connection refused -- "
                                          "is the server running"));
}

TEST(ServerCheckTest, AHealthyServerPassesEveryStepInOrder) {
  auto server = StartServer();
  ServerCheckOptions options = OptionsFor(server->address());
  options.signature = Signature();
  const ServerCheckResult result = CheckServer(options);
  EXPECT_TRUE(result.ok) << absl::StrJoin(result.lines, "\n");
  ASSERT_EQ(result.lines.size(), 6u) << absl::StrJoin(result.lines, "\n");
  EXPECT_EQ(result.lines[0], "ok: 127.0.0.1 resolves");
  EXPECT_EQ(result.lines[1], absl::StrCat("ok: TCP connects to ", server->address()));
  EXPECT_THAT(result.lines[2], StartsWith("ok: the server answers: 0 of 2 workers registered"));
  EXPECT_EQ(result.lines[3], "ok: the model matches (2 tensors)");
  EXPECT_THAT(result.lines[4], StartsWith("ok: round trip "));
  EXPECT_THAT(result.lines[5], StartsWith("ok: pulls "));
  EXPECT_THAT(result.lines[5], HasSubstr("of 'fc.weight' five times"));
}

TEST(ServerCheckTest, AnotherModelStopsTheCheckAtTheModelStep) {
  auto server = StartServer();
  ServerCheckOptions options = OptionsFor(server->address());
  options.signature = {{"fc.weight", {3, 5}, DType::kF32}, {"fc.bias", {3}, DType::kF32}};
  const ServerCheckResult result = CheckServer(options);
  EXPECT_FALSE(result.ok);
  ASSERT_EQ(result.lines.size(), 4u) << absl::StrJoin(result.lines, "\n");
  EXPECT_THAT(result.lines[3],
              StartsWith("FAIL: the server's model differs: 'fc.weight' has shape "));
  EXPECT_THAT(result.lines[3], HasSubstr("same --model"));
}

}  // namespace
}  // namespace ps::worker
