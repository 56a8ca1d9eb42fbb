#include "worker/device_overlap.h"

#include <cstring>
#include <deque>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/cpu_device.h"
#include "gtest/gtest.h"
#include "worker/fake_stores.h"
#include "worker/parameter_store.h"

namespace ps::worker {
namespace {

// A device whose copies to host land only when the test says so (as a CUDA
// device's land while its compute stream runs on): each one reads its
// source then, and then calls its done. Its memory is not host memory.
class DeferredCopyDevice final : public CpuDevice {
 public:
  DeferredCopyDevice() : CpuDevice(0, 1) {}
  bool is_host_memory() const override { return false; }

  int pending() {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(copies_.size());
  }
  // Lands the oldest copy (blocks until there is one).
  void LandNext() {
    Copy copy;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](std::deque<Copy>* copies) { return !copies->empty(); }, &copies_));
      copy = std::move(copies_.front());
      copies_.pop_front();
    }
    if (copy.bytes > 0) std::memcpy(copy.dst, copy.src, copy.bytes);
    copy.done(fail_ ? absl::DataLossError("copy failed") : absl::OkStatus());
  }
  void FailCopies() { fail_ = true; }
  int ordered_after_copies() const { return ordered_after_copies_; }

  absl::Status OrderAfterCopiesToHost() override {
    ++ordered_after_copies_;
    return absl::OkStatus();
  }

 protected:
  absl::Status DoCopyDeviceToHostAsync(void* dst, const void* src, int64_t bytes,
                                       CopyDone done) override {
    absl::MutexLock lock(&mu_);
    copies_.push_back({dst, src, bytes, std::move(done)});
    return absl::OkStatus();
  }

 private:
  struct Copy {
    void* dst = nullptr;
    const void* src = nullptr;
    int64_t bytes = 0;
    CopyDone done;
  };
  absl::Mutex mu_;
  std::deque<Copy> copies_ ABSL_GUARDED_BY(mu_);
  bool fail_ = false;
  int ordered_after_copies_ = 0;
};

using testing::RecordingStore;

// A model of three layers of 4 parameters, a bucket each, on a
// DeferredCopyDevice, the scheduler starting from version 5.
struct Rig {
  Rig() : store({4, 8, 12}) {
    for (int64_t i = 0; i < n; ++i) device_gradients[i] = 1.f / (3 + i);
    PushPullOptions options;
    options.bucket_bytes = 0;
    auto s = PushPullScheduler::Create(options, &store, host_gradients,
                                       absl::MakeSpan(host_parameters), /*version=*/5);
    EXPECT_TRUE(s.ok()) << s.status();
    scheduler = std::move(*s);
    overlap =
        std::make_unique<DeviceOverlap>(&device, device_gradients.data(), device_parameters.data(),
                                        host_gradients.data(), host_parameters.data(), n);
  }
  std::vector<float> DeviceGradients(int64_t begin, int64_t end) const {
    return std::vector<float>(device_gradients.begin() + begin, device_gradients.begin() + end);
  }

  const int64_t n = 12;
  DeferredCopyDevice device;
  RecordingStore store;
  std::vector<float> device_gradients = std::vector<float>(12);
  std::vector<float> device_parameters = std::vector<float>(12, -1.f);
  std::vector<float> host_gradients = std::vector<float>(12);
  std::vector<float> host_parameters = std::vector<float>(12, 5.f);
  std::unique_ptr<PushPullScheduler> scheduler;
  std::unique_ptr<DeviceOverlap> overlap;
};

TEST(DeviceOverlapTest, ARegionIsPushedWhenItsCopyLandsNotWhenBackwardIssuesIt) {
  Rig rig;
  ASSERT_TRUE(rig.scheduler->BeginIteration(1).ok());
  ASSERT_TRUE(rig.overlap->BeginStep(rig.scheduler.get()).ok());
  EXPECT_EQ(rig.device.ordered_after_copies(), 1);
  // Layer 2's backward issued: its copy is issued, nothing is pushed.
  rig.overlap->hooks()->AfterBackward(8, 12);
  EXPECT_EQ(rig.device.pending(), 1);
  EXPECT_TRUE(rig.store.pushed().empty());
  rig.device.LandNext();
  auto pushed = rig.store.pushed();
  ASSERT_EQ(pushed.size(), 1u);
  EXPECT_EQ(pushed[0].first, 2);
  EXPECT_EQ(pushed[0].values, rig.DeviceGradients(8, 12));
  // Layer 1 in two reports (weights, then the whole layer): one copy.
  rig.overlap->hooks()->GradientsReady(4, 8);
  rig.overlap->hooks()->AfterBackward(4, 8);
  EXPECT_EQ(rig.device.pending(), 1);
  rig.device.LandNext();
  // Layer 0 reports nothing: FinishStep copies it and waits for it to land.
  std::thread finish([&] { EXPECT_TRUE(rig.overlap->FinishStep().ok()); });
  rig.device.LandNext();
  finish.join();
  pushed = rig.store.pushed();
  ASSERT_EQ(pushed.size(), 3u);
  EXPECT_EQ(pushed[1].first, 1);
  EXPECT_EQ(pushed[1].values, rig.DeviceGradients(4, 8));
  EXPECT_EQ(pushed[2].first, 0);
  EXPECT_EQ(pushed[2].values, rig.DeviceGradients(0, 4));
  EXPECT_EQ(rig.device.counters().device_to_host(CopyKind::kModel), 12 * 4);
}

TEST(DeviceOverlapTest, ForwardWaitsForEachLayersPullThenCopiesItToTheDevice) {
  Rig rig;
  for (int64_t step = 0; step < 3; ++step) {
    SCOPED_TRACE(step);
    if (step == 2) rig.overlap->ParametersCopied();  // as after FinishCommunication
    ASSERT_TRUE(rig.scheduler->BeginIteration(1).ok());
    ASSERT_TRUE(rig.overlap->BeginStep(rig.scheduler.get()).ok());
    rig.device.ResetCounters();
    for (int64_t begin : {0, 4, 8}) {
      ASSERT_TRUE(rig.overlap->hooks()->BeforeForward(begin, begin + 4).ok());
    }
    // The pulls of the last step (version 5 + step) are copied, except
    // after ParametersCopied: the device holds them already.
    const int64_t copied = step == 2 ? 0 : rig.n * 4;
    EXPECT_EQ(rig.device.counters().host_to_device(CopyKind::kModel), copied);
    if (step < 2) {
      EXPECT_EQ(rig.device_parameters, std::vector<float>(12, 5.f + step));
    }
    std::thread finish([&] { EXPECT_TRUE(rig.overlap->FinishStep().ok()); });
    rig.device.LandNext();
    finish.join();
    ASSERT_TRUE(rig.scheduler->AwaitAll().ok());
  }
}

TEST(DeviceOverlapTest, AFailedCopyIsNotPushedAndFailsTheStep) {
  Rig rig;
  ASSERT_TRUE(rig.scheduler->BeginIteration(1).ok());
  ASSERT_TRUE(rig.overlap->BeginStep(rig.scheduler.get()).ok());
  rig.device.FailCopies();
  rig.overlap->hooks()->AfterBackward(8, 12);
  std::thread finish(
      [&] { EXPECT_EQ(rig.overlap->FinishStep().code(), absl::StatusCode::kDataLoss); });
  rig.device.LandNext();
  rig.device.LandNext();
  finish.join();
  EXPECT_TRUE(rig.store.pushed().empty());
  EXPECT_EQ(rig.overlap->BeginStep(rig.scheduler.get()).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(rig.overlap->hooks()->BeforeForward(0, 4).code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace ps::worker
