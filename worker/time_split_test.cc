#include "worker/time_split.h"

#include "gtest/gtest.h"

namespace ps::worker {
namespace {

TimedEvent Event(EventKind kind, int64_t start_ns, int64_t end_ns, int32_t lane = kTrainerLane) {
  TimedEvent e;
  e.kind = kind;
  e.lane = lane;
  e.step = 0;
  e.start_ns = start_ns;
  e.end_ns = end_ns;
  return e;
}

TEST(TimeSplitObserverTest, SumsEachTrainerPhaseIntoItsField) {
  TimeSplitObserver observer;
  // Two steps' worth; copy is copy_to_host + copy_to_device.
  for (int step = 0; step < 2; ++step) {
    observer.OnEvent(Event(EventKind::kData, 0, 1'000'000'000));
    observer.OnEvent(Event(EventKind::kCompute, 0, 2'000'000'000));
    observer.OnEvent(Event(EventKind::kReduce, 0, 3'000'000'000));
    observer.OnEvent(Event(EventKind::kCopyToHost, 0, 250'000'000));
    observer.OnEvent(Event(EventKind::kPush, 0, 5'000'000'000));
    observer.OnEvent(Event(EventKind::kWait, 0, 6'000'000'000));
    observer.OnEvent(Event(EventKind::kPull, 0, 7'000'000'000));
    observer.OnEvent(Event(EventKind::kCopyToDevice, 10, 500'000'010));
  }
  const TimeSplit s = observer.split();
  EXPECT_EQ(s.data, 2.0);
  EXPECT_EQ(s.compute, 4.0);
  EXPECT_EQ(s.reduce, 6.0);
  EXPECT_EQ(s.copy, 1.5);
  EXPECT_EQ(s.push, 10.0);
  EXPECT_EQ(s.wait, 12.0);
  EXPECT_EQ(s.pull, 14.0);
}

TEST(TimeSplitObserverTest, IgnoresOtherLanesAndDetailEvents) {
  TimeSplitObserver observer;
  observer.OnEvent(Event(EventKind::kCompute, 0, 100, DeviceLane(0)));
  observer.OnEvent(Event(EventKind::kPush, 0, 100, RpcLane(1)));
  observer.OnEvent(Event(EventKind::kForward, 0, 100));
  observer.OnEvent(Event(EventKind::kPushMessage, 0, 100));
  const TimeSplit s = observer.split();
  EXPECT_EQ(s.compute, 0);
  EXPECT_EQ(s.push, 0);
  EXPECT_EQ(s.data + s.reduce + s.copy + s.wait + s.pull, 0);
}

TEST(TimeSplitObserverTest, ResetStartsOver) {
  TimeSplitObserver observer;
  observer.OnEvent(Event(EventKind::kWait, 0, 1000));
  observer.Reset();
  observer.OnEvent(Event(EventKind::kWait, 0, 3000));
  EXPECT_EQ(observer.split().wait, 3e-6);
}

TEST(TimeSplitObserverTest, PhaseSumsKeepEachPhaseApartWithItsCount) {
  TimeSplitObserver observer;
  observer.OnEvent(Event(EventKind::kData, 0, 100));
  observer.OnEvent(Event(EventKind::kCopyToDevice, 0, 7));
  observer.OnEvent(Event(EventKind::kData, 0, 200));
  observer.OnEvent(Event(EventKind::kCopyToHost, 0, 5));
  observer.OnEvent(Event(EventKind::kPull, 0, 100, RpcLane(0)));  // not the trainer's
  observer.OnEvent(Event(EventKind::kForward, 0, 100));          // a detail
  const std::vector<PhaseSum> sums = observer.phase_sums();
  ASSERT_EQ(sums.size(), 3u);  // the phases seen, in EventKind order
  EXPECT_EQ(sums[0].kind, EventKind::kData);
  EXPECT_EQ(sums[0].nanoseconds, 300);
  EXPECT_EQ(sums[0].count, 2);
  EXPECT_EQ(sums[1].kind, EventKind::kCopyToHost);
  EXPECT_EQ(sums[1].nanoseconds, 5);
  EXPECT_EQ(sums[1].count, 1);
  EXPECT_EQ(sums[2].kind, EventKind::kCopyToDevice);
  EXPECT_EQ(sums[2].nanoseconds, 7);
  EXPECT_EQ(sums[2].count, 1);
  observer.Reset();
  EXPECT_TRUE(observer.phase_sums().empty());
}

TEST(TimeSplitTest, AddSplitAddsEveryField) {
  TimeSplit a{1, 2, 3, 4, 5, 6, 7};
  AddSplit(&a, TimeSplit{10, 20, 30, 40, 50, 60, 70});
  EXPECT_EQ(a.data, 11);
  EXPECT_EQ(a.compute, 22);
  EXPECT_EQ(a.reduce, 33);
  EXPECT_EQ(a.copy, 44);
  EXPECT_EQ(a.push, 55);
  EXPECT_EQ(a.wait, 66);
  EXPECT_EQ(a.pull, 77);
}

}  // namespace
}  // namespace ps::worker
