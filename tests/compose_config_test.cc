// deploy/compose/compose.yaml is a valid Compose file as docker-compose
// reads it (offline: `config` needs no daemon), its shards and workers
// agree on the addresses, every connection is mutual TLS with the job token
// and each worker has an identity of its own, and the check is strict: a misspelled key and a
// value of the wrong type are refused, naming them. compose_test runs it.

#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/testing/subprocess.h"

namespace ps {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::RunCommand;
using testing::RunfilePath;
using testing::ShellQuote;
using testing::TestTmpPath;

// `docker-compose config` of `compose` (the file's text) beside the shipped
// .env, in a fresh folder `name`; its exit code, its output in *output.
int ComposeConfig(const std::string& name, const std::string& compose, const std::string& args,
                  std::string* output) {
  const std::string dir = TestTmpPath(name);
  RunCommand("mkdir -p " + dir + " && cp " + ShellQuote(RunfilePath("deploy/compose/.env")) +
                 " " + dir,
             output);
  std::ofstream(dir + "/compose.yaml") << compose;
  return RunCommand("cd " + dir + " && docker-compose -f compose.yaml config " + args + " 2>&1",
                    output);
}

TEST(ComposeConfigTest, TheShippedFileIsValidAndItsAddressesAgree) {
  const std::string shipped = testing::ReadFileBytes(RunfilePath("deploy/compose/compose.yaml"));
  ASSERT_FALSE(shipped.empty());
  std::string output;
  ASSERT_EQ(ComposeConfig("shipped", shipped, "-q", &output), 0) << output;
  EXPECT_EQ(output, "");

  ASSERT_EQ(ComposeConfig("shipped", shipped, "", &output), 0) << output;
  // Each shard advertises the service name it is reached by; the workers
  // list both shards in order; as many workers as the job's NUM_WORKERS.
  EXPECT_THAT(output, HasSubstr("--advertise_address=server-0:50051"));
  EXPECT_THAT(output, HasSubstr("--advertise_address=server-1:50051"));
  EXPECT_THAT(output, HasSubstr("--server=server-0:50051,server-1:50051"));
  EXPECT_THAT(output, HasSubstr("--num_workers=2"));
  EXPECT_THAT(output, HasSubstr("condition: service_healthy"));
  EXPECT_THAT(output, HasSubstr("condition: service_completed_successfully"));
  // Secure by default: mutual TLS and the token on the servers, and each
  // worker presents its own certificate (its volume) under its own id.
  EXPECT_THAT(output, Not(HasSubstr("--insecure")));
  EXPECT_THAT(output, HasSubstr("--tls_client_ca=/etc/ps/tls/ca.crt"));
  EXPECT_THAT(output, HasSubstr("--job_token_file=/etc/ps/tls/token"));
  EXPECT_THAT(output, HasSubstr("--tls_cert=/etc/ps/tls/tls.crt"));
  for (const char* id : {"w0", "w1"}) {
    EXPECT_THAT(output, HasSubstr(absl::StrCat("--worker_id=", id)));
    EXPECT_THAT(output, HasSubstr(absl::StrCat("pki-", id, ":/etc/ps/tls:ro")));
  }
  EXPECT_THAT(output, HasSubstr("pki-server-0:/etc/ps/tls:ro"));
  EXPECT_THAT(output, HasSubstr("pki-server-1:/etc/ps/tls:ro"));
}

TEST(ComposeConfigTest, AMisspelledKeyIsRefused) {
  const std::string shipped = testing::ReadFileBytes(RunfilePath("deploy/compose/compose.yaml"));
  const std::string broken =
      absl::StrReplaceAll(shipped, {{"restart: on-failure", "restrat: on-failure"}});
  ASSERT_NE(broken, shipped);
  std::string output;
  EXPECT_NE(ComposeConfig("misspelled", broken, "-q", &output), 0) << output;
  EXPECT_THAT(output, HasSubstr("restrat"));
}

TEST(ComposeConfigTest, AValueOfTheWrongTypeIsRefused) {
  const std::string shipped = testing::ReadFileBytes(RunfilePath("deploy/compose/compose.yaml"));
  const std::string broken = absl::StrReplaceAll(shipped, {{"retries: 3", "retries: three"}});
  ASSERT_NE(broken, shipped);
  std::string output;
  EXPECT_NE(ComposeConfig("wrong-type", broken, "-q", &output), 0) << output;
  EXPECT_THAT(output, HasSubstr("retries"));
}

}  // namespace
}  // namespace ps
