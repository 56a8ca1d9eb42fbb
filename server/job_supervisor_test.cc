#include "server/job_supervisor.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr int64_t kSecond = 1'000'000'000;

// Two ranks at iteration 3: rank 0 has pushed it all and keeps talking,
// rank 1 pushed nothing and was last heard at time 0.
class JobSupervisorTest : public ::testing::Test {
 protected:
  JobSupervisorTest() {
    progress_.version = 3;
    progress_.initialized = true;
    progress_.version_ns = 0;
    progress_.total_chunks = 2;
    progress_.workers.resize(2);
    for (int r = 0; r < 2; ++r) {
      progress_.workers[r].rank = r;
      progress_.workers[r].id = absl::StrCat("w", r);
      progress_.workers[r].heard_ns = 0;
      progress_.workers[r].next_iteration = 3;
    }
    progress_.workers[0].pushed_chunks = 2;
    progress_.workers[0].next_iteration = 4;
  }

  JobSupervisor Make(const WorkerLossPolicy* policy) {
    JobSupervisorOptions options;
    options.stall_report_every = absl::Seconds(5);
    options.liveness_timeout = absl::Seconds(10);
    options.policy = policy;
    options.clock = &clock_;
    options.log = [this](const std::string& line) { log_.push_back(line); };
    SupervisedJob job;
    job.progress = [this] {
      progress_.workers[0].heard_ns = clock_.NowNanos();  // rank 0 is alive
      return progress_;
    };
    job.drop = [this](int rank) {
      dropped_.push_back(rank);
      return absl::OkStatus();
    };
    job.fail = [this](const absl::Status& failure) { failures_.push_back(failure); };
    return JobSupervisor(std::move(options), std::move(job));
  }

  void AdvanceSeconds(double s) { clock_.Advance(static_cast<int64_t>(s * kSecond)); }

  FakeClock clock_;
  JobProgress progress_;
  std::vector<std::string> log_;
  std::vector<int> dropped_;
  std::vector<absl::Status> failures_;
};

TEST_F(JobSupervisorTest, ReportsAStallOnceItHasWaitedAndThenAtItsPeriod) {
  auto wait = WaitForLostWorkers(absl::Minutes(10));
  JobSupervisor supervisor = Make(wait.get());
  AdvanceSeconds(4.9);
  EXPECT_TRUE(supervisor.Tick());
  EXPECT_THAT(log_, IsEmpty());
  AdvanceSeconds(0.1);
  EXPECT_TRUE(supervisor.Tick());
  ASSERT_EQ(log_.size(), 1u);
  EXPECT_THAT(log_[0], HasSubstr("iteration 3 has waited 5.0 s for rank 1"));
  AdvanceSeconds(4.9);
  supervisor.Tick();
  EXPECT_EQ(log_.size(), 1u);  // not yet due again
  AdvanceSeconds(0.1);
  supervisor.Tick();
  EXPECT_EQ(log_.size(), 2u);
  // Once rank 1 has pushed, nothing stalls and nothing is said.
  progress_.workers[1].pushed_chunks = 2;
  progress_.workers[1].next_iteration = 4;
  AdvanceSeconds(20);
  EXPECT_TRUE(supervisor.Tick());
  EXPECT_EQ(log_.size(), 2u);
  EXPECT_THAT(failures_, IsEmpty());
}

TEST_F(JobSupervisorTest, WaitFailsTheJobExactlyAtTheLossTimeoutThroughTheCallback) {
  auto wait = WaitForLostWorkers(absl::Seconds(30));
  JobSupervisor supervisor = Make(wait.get());
  clock_.Advance(30 * kSecond - 1);
  EXPECT_TRUE(supervisor.Tick());  // lost (past 10 s) but 1 ns short of the 30 s
  EXPECT_THAT(failures_, IsEmpty());
  clock_.Advance(1);  // 30 s since rank 1 was heard: the timeout is spent
  EXPECT_FALSE(supervisor.Tick());
  ASSERT_EQ(failures_.size(), 1u);
  EXPECT_EQ(failures_[0].code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(failures_[0].message(),
              HasSubstr("job failed: worker rank 1 ('w1') lost for 30s at iteration 3"));
  EXPECT_THAT(log_.back(), HasSubstr("job failed: worker rank 1"));
  EXPECT_TRUE(supervisor.failed());
  AdvanceSeconds(60);
  EXPECT_FALSE(supervisor.Tick());
  EXPECT_EQ(failures_.size(), 1u);  // once
  EXPECT_THAT(dropped_, IsEmpty());
}

TEST_F(JobSupervisorTest, ShrinkDropsALostWorkerAfterTheGracePeriod) {
  auto shrink = ShrinkOnWorkerLoss();
  JobSupervisor supervisor = Make(shrink.get());
  AdvanceSeconds(10);
  supervisor.Tick();
  EXPECT_THAT(dropped_, IsEmpty());  // heard exactly 10 s ago: not yet lost
  clock_.Advance(1);
  EXPECT_TRUE(supervisor.Tick());
  EXPECT_THAT(dropped_, ElementsAre(1));
  EXPECT_THAT(log_.back(), HasSubstr("dropped rank 1 ('w1'), lost at iteration 3"));
  EXPECT_THAT(failures_, IsEmpty());
}

TEST_F(JobSupervisorTest, ShrinkWaitsForARankNobodyHolds) {
  progress_.workers[1].id.clear();
  progress_.workers[1].heard_ns = -1;
  auto shrink = ShrinkOnWorkerLoss();
  JobSupervisor supervisor = Make(shrink.get());
  AdvanceSeconds(100);
  EXPECT_TRUE(supervisor.Tick());
  EXPECT_THAT(dropped_, IsEmpty());
  ASSERT_FALSE(log_.empty());
  EXPECT_THAT(log_.back(), HasSubstr("rank 1"));
}

}  // namespace
}  // namespace ps::server
