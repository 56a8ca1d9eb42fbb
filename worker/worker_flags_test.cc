#include "worker/worker_flags.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

ABSL_DECLARE_FLAG(std::string, server);
ABSL_DECLARE_FLAG(std::string, devices);
ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, mlp_hidden);
ABSL_DECLARE_FLAG(int64_t, linear_block_rows);
ABSL_DECLARE_FLAG(int64_t, batch_size);
ABSL_DECLARE_FLAG(std::string, compute);
ABSL_DECLARE_FLAG(double, replay_step_ms);
ABSL_DECLARE_FLAG(std::string, precision);
ABSL_DECLARE_FLAG(bool, check);
ABSL_DECLARE_FLAG(bool, recover);
ABSL_DECLARE_FLAG(int, rank);
ABSL_DECLARE_FLAG(absl::Duration, connect_timeout);
ABSL_DECLARE_FLAG(absl::Duration, reconnect_timeout);
ABSL_DECLARE_FLAG(std::string, tls_ca);
ABSL_DECLARE_FLAG(std::string, job_token_file);
ABSL_DECLARE_FLAG(std::string, identity_file);
ABSL_DECLARE_FLAG(double, lr);

namespace ps::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class WorkerFlagsTest : public ::testing::Test {
 protected:
  // A command line that names no flag (tests set them with SetFlag).
  absl::StatusOr<WorkerOptions> FromFlags() {
    return WorkerOptionsFromFlags(1, const_cast<char**>(kArgv));
  }

  static constexpr const char* kArgv[] = {"worker", nullptr};
  absl::FlagSaver saver_;  // every test starts from the defaults
};

TEST_F(WorkerFlagsTest, DefaultsAreTheDocumentedOnes) {
  absl::StatusOr<WorkerOptions> options = FromFlags();
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_TRUE(options->servers.empty());
  EXPECT_TRUE(options->devices.auto_select);
  EXPECT_EQ(options->threads, 0);
  EXPECT_EQ(options->model.name, "lenet");
  EXPECT_THAT(options->model.mlp_hidden, ElementsAre(256));
  EXPECT_EQ(options->dataset, "fashion_mnist");
  EXPECT_EQ(options->trainer.batch_size, 256);
  EXPECT_EQ(options->trainer.epochs, 10);
  EXPECT_EQ(options->trainer.precision, Precision::kFp32);
  EXPECT_FALSE(options->trainer.replay_compute);
  EXPECT_TRUE(options->trainer.recover_from_server_loss);
  EXPECT_EQ(options->remote.rank, -1);
  EXPECT_EQ(options->remote.compression, "none");
  EXPECT_EQ(options->remote.reconnect_timeout, absl::Minutes(5));
  EXPECT_EQ(options->remote.connect_timeout, absl::Seconds(60));
  EXPECT_TRUE(options->remote.job_token.empty());
  EXPECT_FALSE(options->check);
  EXPECT_EQ(options->metrics_port, -1);
  EXPECT_TRUE(options->trace.empty());
}

// A WorkerOptions built in code means what the flags' defaults mean.
TEST_F(WorkerFlagsTest, DefaultOptionsAreTheFlagsDefaults) {
  absl::StatusOr<WorkerOptions> from_flags = FromFlags();
  ASSERT_TRUE(from_flags.ok()) << from_flags.status();
  const WorkerOptions in_code;
  EXPECT_EQ(in_code.devices.auto_select, from_flags->devices.auto_select);
  EXPECT_EQ(in_code.model.mlp_hidden, from_flags->model.mlp_hidden);
  EXPECT_EQ(in_code.data_dir, from_flags->data_dir);
  EXPECT_EQ(in_code.trainer.batch_size, from_flags->trainer.batch_size);
  EXPECT_EQ(in_code.trainer.push_pull.bucket_bytes, from_flags->trainer.push_pull.bucket_bytes);
  EXPECT_EQ(in_code.remote.connections, from_flags->remote.connections);
  EXPECT_EQ(in_code.remote.reconnect_timeout, from_flags->remote.reconnect_timeout);
  EXPECT_EQ(in_code.servers, from_flags->servers);
}

TEST_F(WorkerFlagsTest, CarriesTheFlagsIntoTheOptions) {
  absl::SetFlag(&FLAGS_devices, "cpu:2");
  absl::SetFlag(&FLAGS_model, "mlp");
  absl::SetFlag(&FLAGS_mlp_hidden, "64,32");
  absl::SetFlag(&FLAGS_linear_block_rows, 16);
  absl::SetFlag(&FLAGS_compute, "replay");
  absl::SetFlag(&FLAGS_replay_step_ms, 2.5);
  absl::SetFlag(&FLAGS_precision, "bf16");
  absl::SetFlag(&FLAGS_recover, false);
  absl::SetFlag(&FLAGS_lr, 0.25);
  absl::StatusOr<WorkerOptions> options = FromFlags();
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_FALSE(options->devices.auto_select);
  EXPECT_EQ(options->devices.count, 2);
  EXPECT_EQ(options->model.name, "mlp");
  EXPECT_THAT(options->model.mlp_hidden, ElementsAre(64, 32));
  EXPECT_EQ(options->model.linear_block_rows, 16);
  EXPECT_TRUE(options->trainer.replay_compute);
  EXPECT_DOUBLE_EQ(options->trainer.replay_step_seconds, 0.0025);
  EXPECT_EQ(options->trainer.precision, Precision::kBf16);
  EXPECT_FALSE(options->trainer.recover_from_server_loss);
  EXPECT_FLOAT_EQ(options->optimizer.sgd.lr, 0.25f);
}

TEST_F(WorkerFlagsTest, ServersCarryTheirConnectionAndCheck) {
  absl::SetFlag(&FLAGS_server, "a:1,b:2");
  absl::SetFlag(&FLAGS_rank, 3);
  absl::SetFlag(&FLAGS_reconnect_timeout, absl::Seconds(7));
  absl::SetFlag(&FLAGS_connect_timeout, absl::Seconds(9));
  absl::SetFlag(&FLAGS_tls_ca, "/ca.pem");
  absl::SetFlag(&FLAGS_check, true);
  absl::StatusOr<WorkerOptions> options = FromFlags();
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->servers, "a:1,b:2");
  EXPECT_EQ(options->remote.rank, 3);
  EXPECT_EQ(options->remote.reconnect_timeout, absl::Seconds(7));
  EXPECT_EQ(options->remote.connect_timeout, absl::Seconds(9));
  EXPECT_EQ(options->remote.tls.ca_file, "/ca.pem");
  EXPECT_TRUE(options->check);
}

TEST_F(WorkerFlagsTest, NamesEachBadFlag) {
  auto refused = [this](const std::string& what) {
    const absl::Status s = FromFlags().status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr(what));
  };
  absl::SetFlag(&FLAGS_devices, "tpu");
  refused("--devices: bad device list 'tpu'");
  absl::SetFlag(&FLAGS_devices, "auto");

  absl::SetFlag(&FLAGS_mlp_hidden, "64,-1");
  refused("--mlp_hidden");
  absl::SetFlag(&FLAGS_mlp_hidden, "256");

  absl::SetFlag(&FLAGS_linear_block_rows, -1);
  refused("--linear_block_rows is -1; 0 or more");
  absl::SetFlag(&FLAGS_linear_block_rows, 0);

  absl::SetFlag(&FLAGS_precision, "fp8");
  refused("--precision: unknown precision \"fp8\"");
  absl::SetFlag(&FLAGS_precision, "fp32");

  absl::SetFlag(&FLAGS_compute, "simulate");
  refused("--compute must be real or replay, got 'simulate'");
  absl::SetFlag(&FLAGS_compute, "real");

  absl::SetFlag(&FLAGS_batch_size, 0);
  refused("--batch_size must be >= 1, got 0");
  absl::SetFlag(&FLAGS_batch_size, 256);

  absl::SetFlag(&FLAGS_check, true);
  refused("--check needs --server");
  absl::SetFlag(&FLAGS_check, false);

  absl::SetFlag(&FLAGS_connect_timeout, absl::ZeroDuration());
  refused("--connect_timeout is 0; it must be positive");
  absl::SetFlag(&FLAGS_connect_timeout, absl::Seconds(60));
  absl::SetFlag(&FLAGS_reconnect_timeout, absl::Seconds(-1));
  refused("--reconnect_timeout is -1s; it must be positive");
  absl::SetFlag(&FLAGS_reconnect_timeout, absl::Minutes(5));

  EXPECT_TRUE(FromFlags().ok());
}

TEST_F(WorkerFlagsTest, RefusesTheServersOptimizerFlagsWithServer) {
  absl::SetFlag(&FLAGS_server, "127.0.0.1:50051");
  // Named on the command line at its default value: still the server's.
  const char* argv[] = {"worker", "--lr=0.9", nullptr};
  absl::Status s = WorkerOptionsFromFlags(2, const_cast<char**>(argv)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--lr is the server's with --server"));

  // Set to another value (a flagfile, say) without being named.
  absl::SetFlag(&FLAGS_lr, 0.5);
  s = FromFlags().status();
  EXPECT_THAT(s.message(), HasSubstr("--lr is the server's with --server"));

  // Alone, the optimizer is this worker's.
  absl::SetFlag(&FLAGS_server, "");
  absl::StatusOr<WorkerOptions> options = FromFlags();
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_FLOAT_EQ(options->optimizer.sgd.lr, 0.5f);
}

TEST_F(WorkerFlagsTest, ReadsTheJobTokenOnlyWithServers) {
  absl::SetFlag(&FLAGS_job_token_file, "/nonexistent/token");
  EXPECT_TRUE(FromFlags().ok());  // alone: never read
  absl::SetFlag(&FLAGS_server, " , ");  // no address in it
  EXPECT_TRUE(FromFlags().ok());
  absl::SetFlag(&FLAGS_server, "127.0.0.1:50051");
  EXPECT_FALSE(FromFlags().ok());
}

TEST_F(WorkerFlagsTest, TheIdentityFileIsMadeOnceAndReadWithServers) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir != nullptr ? dir : "/tmp") + "/flags.identity";
  std::remove(path.c_str());
  absl::SetFlag(&FLAGS_identity_file, path);
  absl::StatusOr<WorkerOptions> alone = FromFlags();
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_TRUE(alone->remote.identity_proof.empty());  // training alone: not made
  absl::SetFlag(&FLAGS_server, "127.0.0.1:50051");
  absl::StatusOr<WorkerOptions> first = FromFlags();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->remote.identity_proof.size(), 64u);
  absl::StatusOr<WorkerOptions> restarted = FromFlags();
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  EXPECT_EQ(restarted->remote.identity_proof, first->remote.identity_proof);
  absl::SetFlag(&FLAGS_identity_file, "/nonexistent/dir/w0.identity");
  EXPECT_THAT(FromFlags().status().message(), HasSubstr("/nonexistent/dir/w0.identity"));
}

}  // namespace
}  // namespace ps::worker
