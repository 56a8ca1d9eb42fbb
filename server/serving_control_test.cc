#include "server/serving_control.h"

#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::server {
namespace {

using ::testing::HasSubstr;

// Each answer a restore got, in order.
struct Answers {
  std::vector<absl::Status> got;
  ServingControl::Done Sink() {
    return [this](absl::Status s) { got.push_back(std::move(s)); };
  }
};

TEST(ServingControlTest, ARestoreWaitsForTheLoopsAnswer) {
  ServingControl control;
  Answers a;
  control.AskRestore(5, a.Sink());
  EXPECT_TRUE(a.got.empty());
  const ServingControl::Event event = control.Wait();
  EXPECT_FALSE(event.stop.has_value());
  EXPECT_EQ(event.restore, 5);
  control.Answer(5, absl::FailedPreconditionError("no checkpoint of version 5"));
  ASSERT_EQ(a.got.size(), 1u);
  EXPECT_EQ(a.got[0].code(), absl::StatusCode::kFailedPrecondition);
}

// Concurrent restores: those of the version restored are told OK, the
// others to register again (UNAVAILABLE), so that they ask anew.
TEST(ServingControlTest, AnAcceptedRestoreAnswersEveryPendingOne) {
  ServingControl control;
  Answers same, other;
  control.AskRestore(10, same.Sink());
  control.AskRestore(10, same.Sink());
  control.AskRestore(5, other.Sink());
  EXPECT_EQ(control.Wait().restore, 10);
  control.Answer(10, absl::OkStatus());
  ASSERT_EQ(same.got.size(), 2u);
  EXPECT_TRUE(same.got[0].ok());
  EXPECT_TRUE(same.got[1].ok());
  ASSERT_EQ(other.got.size(), 1u);
  EXPECT_EQ(other.got[0].code(), absl::StatusCode::kUnavailable);
}

TEST(ServingControlTest, ARefusedRestoreLeavesOthersPending) {
  ServingControl control;
  Answers a, b;
  control.AskRestore(3, a.Sink());
  control.AskRestore(4, b.Sink());
  control.Answer(3, absl::FailedPreconditionError("no"));
  EXPECT_EQ(a.got.size(), 1u);
  EXPECT_TRUE(b.got.empty());
  EXPECT_EQ(control.Wait().restore, 4);
}

// Closed between generations and stopped: nothing stays pending.
TEST(ServingControlTest, CloseAndStopAnswerWhatIsPendingAndWhatComes) {
  ServingControl control;
  Answers a;
  control.AskRestore(3, a.Sink());
  control.Close();
  control.AskRestore(3, a.Sink());
  ASSERT_EQ(a.got.size(), 2u);
  EXPECT_EQ(a.got[0].code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(a.got[1].code(), absl::StatusCode::kUnavailable);
  control.Reopen();
  control.AskRestore(2, a.Sink());
  EXPECT_EQ(a.got.size(), 2u);
  control.Stop("received Terminated");
  control.Stop("a second reason");
  ASSERT_EQ(a.got.size(), 3u);
  EXPECT_THAT(std::string(a.got[2].message()), HasSubstr("received Terminated"));
  const ServingControl::Event event = control.Wait();
  ASSERT_TRUE(event.stop.has_value());
  EXPECT_EQ(*event.stop, "received Terminated");
  control.AskRestore(1, a.Sink());
  EXPECT_EQ(a.got.size(), 4u);
}

TEST(ServingControlTest, WaitWakesOnAStopFromAnotherThread) {
  ServingControl control;
  std::thread stopper([&] { control.Stop("done"); });
  const ServingControl::Event event = control.Wait();
  stopper.join();
  EXPECT_EQ(event.stop.value_or(""), "done");
}

}  // namespace
}  // namespace ps::server
