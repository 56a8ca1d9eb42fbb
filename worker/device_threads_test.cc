#include "worker/device_threads.h"

#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace ps::worker {
namespace {

TEST(DeviceThreadsTest, EveryDeviceRunsOncePerCallOnItsOwnStableThread) {
  for (int d_count : {1, 2, 4}) {
    SCOPED_TRACE(absl::StrCat(d_count, " devices"));
    DeviceThreads threads(d_count);
    ASSERT_EQ(threads.size(), d_count);
    std::vector<std::thread::id> first(d_count);
    for (int call = 0; call < 20; ++call) {
      std::vector<std::thread::id> ids(d_count);
      std::vector<int> runs(d_count, 0);
      ASSERT_TRUE(threads
                      .RunOnAll([&](int d) {
                        ids[d] = std::this_thread::get_id();
                        ++runs[d];
                        return absl::OkStatus();
                      })
                      .ok());
      EXPECT_EQ(runs, std::vector<int>(d_count, 1));
      if (call == 0) {
        first = ids;
      } else {
        EXPECT_EQ(ids, first) << "call " << call << " ran a device on another thread";
      }
    }
    if (d_count == 1) {
      EXPECT_EQ(first[0], std::this_thread::get_id()) << "one device runs inline";
    } else {
      const std::set<std::thread::id> distinct(first.begin(), first.end());
      EXPECT_EQ(distinct.size(), static_cast<size_t>(d_count));
      EXPECT_EQ(distinct.count(std::this_thread::get_id()), 0u);
    }
  }
}

// Every lane must be inside fn at once: each waits (with a timeout, so a
// serial implementation fails instead of hanging) until all have arrived.
TEST(DeviceThreadsTest, DevicesRunConcurrently) {
  constexpr int kDevices = 3;
  DeviceThreads threads(kDevices);
  absl::Mutex mu;
  int arrived = 0;
  const absl::Status status = threads.RunOnAll([&](int d) {
    absl::MutexLock lock(&mu);
    ++arrived;
    auto all_here = [&]() { return arrived == kDevices; };
    if (!mu.AwaitWithTimeout(absl::Condition(&all_here), absl::Seconds(30))) {
      return absl::DeadlineExceededError(absl::StrCat("device ", d, " waited alone"));
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

// Calls are ordered: what the caller wrote before a call is visible to every
// lane, and what the lanes wrote is visible to the caller after it.
TEST(DeviceThreadsTest, CallsAreOrderedAndResultsVisible) {
  constexpr int kDevices = 3, kCalls = 200;
  DeviceThreads threads(kDevices);
  std::vector<std::vector<int>> seen(kDevices);
  int input = 0;
  for (int call = 0; call < kCalls; ++call) {
    input = call;
    ASSERT_TRUE(threads
                    .RunOnAll([&](int d) {
                      seen[d].push_back(input);
                      return absl::OkStatus();
                    })
                    .ok());
    for (int d = 0; d < kDevices; ++d) ASSERT_EQ(seen[d].back(), call) << "device " << d;
  }
  for (int d = 0; d < kDevices; ++d) EXPECT_EQ(seen[d].size(), static_cast<size_t>(kCalls));
}

TEST(DeviceThreadsTest, ReturnsTheFirstErrorInDeviceOrderAfterRunningAll) {
  for (int d_count : {1, 3}) {
    SCOPED_TRACE(absl::StrCat(d_count, " devices"));
    DeviceThreads threads(d_count);
    std::vector<int> ran(d_count, 0);
    const absl::Status status = threads.RunOnAll([&](int d) {
      ran[d] = 1;
      if (d == 0 && d_count == 1) return absl::InternalError("device 0");
      if (d == 1) return absl::InvalidArgumentError("device 1");
      if (d == 2) return absl::InternalError("device 2");
      return absl::OkStatus();
    });
    EXPECT_EQ(ran, std::vector<int>(d_count, 1)) << "a failure stops no other device";
    if (d_count == 1) {
      EXPECT_EQ(status, absl::InternalError("device 0"));
    } else {
      EXPECT_EQ(status, absl::InvalidArgumentError("device 1"));
    }
    // The lanes are usable after a failure, and the old errors are gone.
    EXPECT_TRUE(threads.RunOnAll([](int) { return absl::OkStatus(); }).ok());
  }
}

TEST(DeviceThreadsTest, ConcurrentCallersAreServedOneAfterTheOther) {
  constexpr int kDevices = 2, kCallsPerCaller = 100;
  DeviceThreads threads(kDevices);
  std::vector<int> counts(kDevices, 0);  // unsynchronised: calls must not overlap
  std::atomic<int> in_flight{0};
  std::atomic<bool> overlapped{false};
  auto caller = [&] {
    for (int i = 0; i < kCallsPerCaller; ++i) {
      ASSERT_TRUE(threads
                      .RunOnAll([&](int d) {
                        if (d == 0 && in_flight.fetch_add(1) != 0) overlapped = true;
                        ++counts[d];
                        if (d == 0) in_flight.fetch_sub(1);
                        return absl::OkStatus();
                      })
                      .ok());
    }
  };
  std::thread a(caller), b(caller);
  a.join();
  b.join();
  EXPECT_FALSE(overlapped);
  EXPECT_EQ(counts, std::vector<int>(kDevices, 2 * kCallsPerCaller));
}

// Counts lanes that have exited: a thread-local's destructor runs as its
// thread ends.
std::atomic<int> exited_lanes{0};
struct ExitCounter {
  ~ExitCounter() { exited_lanes.fetch_add(1); }
  void Touch() {}
};

TEST(DeviceThreadsTest, DestructionJoinsEveryThread) {
  constexpr int kDevices = 3;
  exited_lanes = 0;
  {
    DeviceThreads threads(kDevices);
    ASSERT_TRUE(threads
                    .RunOnAll([](int) {
                      thread_local ExitCounter counter;
                      counter.Touch();
                      return absl::OkStatus();
                    })
                    .ok());
    EXPECT_EQ(exited_lanes.load(), 0);
  }
  EXPECT_EQ(exited_lanes.load(), kDevices);
  // Destroying idle threads that never ran anything also returns.
  { DeviceThreads idle(kDevices); }
}

}  // namespace
}  // namespace ps::worker
