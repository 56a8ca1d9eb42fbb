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
ABSL_DECLARE_FLAG(double, momentum);
ABSL_DECLARE_FLAG(std::string, optimizer);
ABSL_DECLARE_FLAG(std::string, loss_scale);

namespace ps::server {
namespace {

using ::testing::HasSubstr;

class ServerFlagsTest : public ::testing::Test {
 protected:
  // The options of the flags as set, with nothing named on a command line.
  static absl::StatusOr<ServerOptions> FromFlags() { return ServerOptionsFromFlags(0, nullptr); }

  absl::FlagSaver saver_;  // every test starts from the defaults
};

TEST_F(ServerFlagsTest, DefaultsAreTheDocumentedOnes) {
  absl::StatusOr<ServerOptions> options = FromFlags();
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->job.num_workers, 1);
  EXPECT_EQ(options->job.consistency->Name(), "sync");
  EXPECT_EQ(options->job.optimizer.kind, "sgd");
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
  absl::StatusOr<ServerOptions> options = FromFlags();
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->job.num_workers, 4);
  EXPECT_EQ(options->job.consistency->Name(), "ssp:2");
  EXPECT_EQ(options->job.chunk_elements, 1024);
  EXPECT_FLOAT_EQ(options->job.optimizer.sgd.lr, 0.25f);
}

TEST_F(ServerFlagsTest, NamesEachBadFlag) {
  absl::SetFlag(&FLAGS_consistency, "bsp");
  absl::Status s = FromFlags().status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--consistency: consistency 'bsp'"));
  absl::SetFlag(&FLAGS_consistency, "sync");

  absl::SetFlag(&FLAGS_liveness_timeout, absl::ZeroDuration());
  absl::SetFlag(&FLAGS_checkpoint_keep, 0);
  s = FromFlags().status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--liveness_timeout=0 (must be finite and > 0)"));
  EXPECT_THAT(s.message(), HasSubstr("--checkpoint_keep=0 (must be >= 1)"));
  absl::SetFlag(&FLAGS_liveness_timeout, absl::Seconds(10));
  absl::SetFlag(&FLAGS_checkpoint_keep, 3);

  absl::SetFlag(&FLAGS_on_worker_loss, "drop");
  s = FromFlags().status();
  EXPECT_THAT(s.message(), HasSubstr("--on_worker_loss=drop: use wait or shrink"));

  absl::SetFlag(&FLAGS_on_worker_loss, "shrink");
  absl::SetFlag(&FLAGS_consistency, "async");
  s = FromFlags().status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("--on_worker_loss=shrink with --consistency=async is not supported"));
  absl::SetFlag(&FLAGS_consistency, "sync");
  EXPECT_TRUE(FromFlags().ok());

  absl::SetFlag(&FLAGS_max_push_lead_bytes, -1);
  s = FromFlags().status();
  EXPECT_THAT(s.message(), HasSubstr("--max_push_lead_bytes must be >= 0"));
}

// A sum-only server takes none of SGD's flags: each one given is named,
// whether on the command line (even at its default value) or by value.
TEST_F(ServerFlagsTest, OptimizerNoneRefusesEachSgdFlagByName) {
  absl::SetFlag(&FLAGS_optimizer, "none");
  absl::StatusOr<ServerOptions> options = FromFlags();
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->job.optimizer.kind, "none");

  absl::SetFlag(&FLAGS_momentum, 0.9);
  char program[] = "server", optimizer[] = "--optimizer=none", lr[] = "--lr=0.9";
  char* argv[] = {program, optimizer, lr};
  absl::Status s = ServerOptionsFromFlags(3, argv).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--optimizer=none publishes the mean gradient; --lr, "
                                     "--momentum apply to --optimizer=sgd"));
  // The same flags are the optimizer's with sgd.
  absl::SetFlag(&FLAGS_optimizer, "sgd");
  options = ServerOptionsFromFlags(3, argv);
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_FLOAT_EQ(options->job.optimizer.sgd.momentum, 0.9f);

  absl::SetFlag(&FLAGS_optimizer, "adam");
  s = FromFlags().status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--optimizer must be sgd or none, got 'adam'"));
}

// Where a version would not be one whole iteration's mean gradient.
TEST_F(ServerFlagsTest, OptimizerNoneRefusesAsyncAndDynamicLossScaling) {
  absl::SetFlag(&FLAGS_optimizer, "none");
  absl::SetFlag(&FLAGS_consistency, "async");
  absl::Status s = FromFlags().status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("(--optimizer=none) cannot run under async consistency: "
                                     "each push would be published alone"));
  absl::SetFlag(&FLAGS_consistency, "ssp:2");
  EXPECT_TRUE(FromFlags().ok());

  absl::SetFlag(&FLAGS_consistency, "sync");
  absl::SetFlag(&FLAGS_loss_scale, "dynamic");
  s = FromFlags().status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("(--optimizer=none) cannot run with dynamic loss scaling "
                                     "(--loss_scale=dynamic): an iteration skipped for an "
                                     "overflow"));
}

}  // namespace
}  // namespace ps::server
