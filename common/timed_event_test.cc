#include "common/timed_event.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ps {
namespace {

class RecordingObserver final : public EventObserver {
 public:
  void OnEvent(const TimedEvent& event) override {
    events.push_back(event);
    names.emplace_back(event.name);
  }
  std::vector<TimedEvent> events;
  std::vector<std::string> names;
};

TEST(ScopedEventTest, ReportsTheScopeOnTheInjectedClock) {
  FakeClock clock(1000);
  RecordingObserver observer;
  {
    ScopedEvent event(&observer, &clock, EventKind::kForward, DeviceLane(1), 7, "conv1", 64);
    clock.Advance(250);
  }
  ASSERT_EQ(observer.events.size(), 1u);
  const TimedEvent& e = observer.events[0];
  EXPECT_EQ(e.kind, EventKind::kForward);
  EXPECT_EQ(e.lane, DeviceLane(1));
  EXPECT_EQ(e.step, 7);
  EXPECT_EQ(observer.names[0], "conv1");
  EXPECT_EQ(e.start_ns, 1000);
  EXPECT_EQ(e.end_ns, 1250);
  EXPECT_EQ(e.bytes, 64);
}

TEST(ScopedEventTest, NullObserverReportsNothing) {
  FakeClock clock;
  { ScopedEvent event(nullptr, &clock, EventKind::kPush, kTrainerLane, 0); }
  SUCCEED();
}

TEST(EventTimerTest, TimesApartOnTheClockAndOnlyWhenObserved) {
  FakeClock clock(500);
  RecordingObserver observer;
  const EventTimer timer(&observer, &clock);
  EXPECT_TRUE(timer.observed());
  const int64_t start = timer.Start();
  EXPECT_EQ(start, 500);
  clock.Advance(40);
  timer.ReportSince(EventKind::kServerPull, kServerPullLane, 3, "fc1.weight", 128, start);
  ASSERT_EQ(observer.events.size(), 1u);
  EXPECT_EQ(observer.events[0].start_ns, 500);
  EXPECT_EQ(observer.events[0].end_ns, 540);
  EXPECT_EQ(observer.names[0], "fc1.weight");
  EXPECT_EQ(timer.NowNanos(), 540);

  const EventTimer unobserved(nullptr, &clock);
  EXPECT_FALSE(unobserved.observed());
  EXPECT_EQ(unobserved.Start(), 0) << "no clock read without an observer";
  unobserved.ReportSince(EventKind::kServerPull, kServerPullLane, 3, "x", 1, 0);
  EXPECT_EQ(unobserved.NowNanos(), 540) << "bookkeeping still reads the clock";
  EXPECT_EQ(EventTimer(nullptr, nullptr).NowNanos(), -1);
}

TEST(ObserverFanOutTest, EveryObserverSeesEveryEvent) {
  RecordingObserver a, b;
  ObserverFanOut fan_out;
  fan_out.Add(&a);
  fan_out.Add(&b);
  TimedEvent e;
  e.kind = EventKind::kWait;
  fan_out.OnEvent(e);
  fan_out.OnEvent(e);
  EXPECT_EQ(a.events.size(), 2u);
  EXPECT_EQ(b.events.size(), 2u);
}

TEST(TimedEventTest, NamesAndLanesAreStable) {
  EXPECT_EQ(EventKindName(EventKind::kCopyToHost), "copy_to_host");
  EXPECT_EQ(EventKindName(EventKind::kPullMessage), "pull_message");
  EXPECT_TRUE(IsStepPhase(EventKind::kCopyToDevice));
  EXPECT_FALSE(IsStepPhase(EventKind::kForward));
  EXPECT_EQ(LaneName(kTrainerLane), "trainer");
  EXPECT_EQ(LaneName(DeviceLane(2)), "device 2");
  EXPECT_EQ(LaneName(RpcLane(3)), "rpc 3");
  EXPECT_EQ(LaneName(kServerUpdateLane), "update");
  EXPECT_EQ(LaneName(kServerPullLane), "pulls");
  EXPECT_EQ(LaneName(ServerPushLane(0)), "pushes of rank 0");
  EXPECT_EQ(LaneName(ServerPushLane(5)), "pushes of rank 5");
}

TEST(TimedEventTest, EveryKindHasItsOwnNameAndOnlyThePhasesAreSteps) {
  const std::vector<std::string> expected = {
      "data",         "compute",      "reduce",      "copy_to_host",  "push",
      "wait",         "pull",         "copy_to_device", "forward",    "backward",
      "push_message", "pull_message", "server_push", "server_update", "server_pull"};
  ASSERT_EQ(expected.size(), static_cast<size_t>(kNumEventKinds));
  for (int k = 0; k < kNumEventKinds; ++k) {
    const EventKind kind = static_cast<EventKind>(k);
    EXPECT_EQ(EventKindName(kind), expected[k]);
    EXPECT_EQ(IsStepPhase(kind), k <= static_cast<int>(EventKind::kCopyToDevice)) << expected[k];
  }
  EXPECT_FALSE(IsStepPhase(EventKind::kServerPush));
  EXPECT_FALSE(IsStepPhase(EventKind::kServerUpdate));
}

TEST(ClockTest, RealClockNeverGoesBack) {
  const int64_t a = Clock::Real()->NowNanos();
  const int64_t b = Clock::Real()->NowNanos();
  EXPECT_LE(a, b);
}

}  // namespace
}  // namespace ps
