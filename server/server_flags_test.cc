#include "server/server_flags.h"

#include <cstdint>
#include <string>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

ABSL_DECLARE_FLAG(std::string, consistency);
ABSL_DECLARE_FLAG(std::string, on_worker_loss);
ABSL_DECLARE_FLAG(absl::Duration, liveness_timeout);
ABSL_DECLARE_FLAG(absl::Duration, worker_loss_timeout);
ABSL_DECLARE_FLAG(int64_t, max_push_lead_bytes);
ABSL_DECLARE_FLAG(int, num_workers);
ABSL_DECLARE_FLAG(int64_t, chunk_bytes);
ABSL_DECLARE_FLAG(int, checkpoint_keep);
ABSL_DECLARE_FLAG(double, lr);

namespace ps::server {
namespace {

using ::testing::HasSubstr;

class ServerFlagsTest : public ::testing::Test {
 protected:
  absl::FlagSaver saver_;  // every test starts from the defaults
};

TEST_F(ServerFlagsTest, DefaultsAreTheDocumentedOnes) {
  absl::StatusOr<ServerOptions> options = ServerOptionsFromFlags();
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->job.num_workers, 1);
  EXPECT_EQ(options->job.consistency->Name(), "sync");
  EXPECT_EQ(options->worker_loss->Name(), "wait");
  EXPECT_EQ(options->bind_address, "127.0.0.1");
  EXPECT_EQ(options->port, 50051);
  EXPECT_EQ(options->liveness_timeout, absl::Seconds(10));
  EXPECT_EQ(options->metrics_port, -1);
}

TEST_F(ServerFlagsTest, CarriesTheFlagsIntoTheOptions) {
  absl::SetFlag(&FLAGS_num_workers, 4);
  absl::SetFlag(&FLAGS_consistency, "ssp:2");
  absl::SetFlag(&FLAGS_chunk_bytes, 4096);
  absl::SetFlag(&FLAGS_lr, 0.25);
  absl::SetFlag(&FLAGS_on_worker_loss, "wait");
  absl::StatusOr<ServerOptions> options = ServerOptionsFromFlags();
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->job.num_workers, 4);
  EXPECT_EQ(options->job.consistency->Name(), "ssp:2");
  EXPECT_EQ(options->job.chunk_elements, 1024);
  EXPECT_FLOAT_EQ(options->job.optimizer.sgd.lr, 0.25f);
}

TEST_F(ServerFlagsTest, NamesEachBadFlag) {
  absl::SetFlag(&FLAGS_consistency, "bsp");
  absl::Status s = ServerOptionsFromFlags().status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--consistency: consistency 'bsp'"));
  absl::SetFlag(&FLAGS_consistency, "sync");

  absl::SetFlag(&FLAGS_liveness_timeout, absl::ZeroDuration());
  absl::SetFlag(&FLAGS_checkpoint_keep, 0);
  s = ServerOptionsFromFlags().status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--liveness_timeout=0 (must be finite and > 0)"));
  EXPECT_THAT(s.message(), HasSubstr("--checkpoint_keep=0 (must be >= 1)"));
  absl::SetFlag(&FLAGS_liveness_timeout, absl::Seconds(10));
  absl::SetFlag(&FLAGS_checkpoint_keep, 3);

  absl::SetFlag(&FLAGS_on_worker_loss, "drop");
  s = ServerOptionsFromFlags().status();
  EXPECT_THAT(s.message(), HasSubstr("--on_worker_loss=drop: use wait or shrink"));

  absl::SetFlag(&FLAGS_on_worker_loss, "shrink");
  absl::SetFlag(&FLAGS_consistency, "async");
  s = ServerOptionsFromFlags().status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("--on_worker_loss=shrink with --consistency=async is not supported"));
  absl::SetFlag(&FLAGS_consistency, "sync");
  EXPECT_TRUE(ServerOptionsFromFlags().ok());

  absl::SetFlag(&FLAGS_max_push_lead_bytes, -1);
  s = ServerOptionsFromFlags().status();
  EXPECT_THAT(s.message(), HasSubstr("--max_push_lead_bytes must be >= 0"));
}

}  // namespace
}  // namespace ps::server
