#include "common/devices.h"

#include <atomic>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/synchronization/notification.h"

#include "common/cpu_device.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

TEST(ParseDeviceSpecTest, AcceptsEveryForm) {
  auto cpu = ParseDeviceSpec("cpu:3");
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(cpu->type, DeviceType::kCpu);
  EXPECT_EQ(cpu->count, 3);

  auto cuda = ParseDeviceSpec("cuda:0,1,1");
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  EXPECT_EQ(cuda->type, DeviceType::kCuda);
  EXPECT_EQ(cuda->gpu_ids, (std::vector<int>{0, 1, 1}));

  auto all = ParseDeviceSpec("cuda");
  ASSERT_TRUE(all.ok());
  EXPECT_TRUE(all->gpu_ids.empty());
  EXPECT_TRUE(ParseDeviceSpec("auto")->auto_select);
}

TEST(ParseDeviceSpecTest, RejectsGarbageWithTheText) {
  for (const char* bad : {"tpu", "cpu:0", "cpu:x", "cuda:a", "cuda:-1", ""}) {
    auto spec = ParseDeviceSpec(bad);
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_NE(ParseDeviceSpec("tpu").status().message().find("tpu"), absl::string_view::npos);
}

TEST(CreateDevicesTest, SplitsThreadsBetweenCpuDevices) {
  auto devices = CreateDevices(*ParseDeviceSpec("cpu:2"), /*cpu_threads=*/4);
  ASSERT_TRUE(devices.ok()) << devices.status();
  ASSERT_EQ(devices->size(), 2u);
  EXPECT_EQ((*devices)[1]->name(), "cpu:1");
  EXPECT_EQ(static_cast<CpuDevice&>(*(*devices)[0]).num_threads(), 2);
}

TEST(CreateDevicesTest, CudaWithoutGpuIsAClearError) {
  if (CudaGpuCount() > 0) GTEST_SKIP() << "a GPU is present";
  auto devices = CreateDevices(*ParseDeviceSpec("cuda"));
  EXPECT_FALSE(devices.ok());
  EXPECT_TRUE(devices.status().code() == absl::StatusCode::kUnavailable ||
              devices.status().code() == absl::StatusCode::kUnimplemented)
      << devices.status();
}

TEST(CpuDeviceTest, ParallelForCoversEveryIndexOnce) {
  CpuDevice device(0, 3);
  for (int64_t n : {0, 1, 2, 7, 1000}) {
    std::vector<std::atomic<int>> hits(n);
    device.ParallelFor(n, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[i]++;
    });
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
  }
}

TEST(CpuDeviceTest, MarksThePartsOfASplitLoopOnly) {
  CpuDevice device(0, 2);
  EXPECT_FALSE(CpuDevice::InParallelPart());
  std::atomic<int> marked{0}, parts{0};
  device.ParallelFor(2, 1, [&](int64_t, int64_t) {
    ++parts;
    if (CpuDevice::InParallelPart()) ++marked;
  });
  EXPECT_EQ(parts.load(), 2);
  EXPECT_EQ(marked.load(), 2);
  EXPECT_FALSE(CpuDevice::InParallelPart());
  // A loop too small to split runs whole on its caller, unmarked.
  device.ParallelFor(1, 1, [&](int64_t, int64_t) { EXPECT_FALSE(CpuDevice::InParallelPart()); });
}

TEST(CpuDeviceTest, ItsMemoryIsHostMemory) {
  CpuDevice device(0, 1);
  EXPECT_TRUE(device.is_host_memory());
}

TEST(CpuDeviceTest, CountsHostCopies) {
  CpuDevice device(0, 1);
  std::vector<float> a(10, 1.f), b(10);
  ASSERT_TRUE(device.CopyHostToDevice(b.data(), a.data(), 40, CopyKind::kModel).ok());
  ASSERT_TRUE(device.CopyDeviceToHost(a.data(), b.data(), 24, CopyKind::kModel).ok());
  ASSERT_TRUE(device.CopyHostToDevice(b.data(), a.data(), 8, CopyKind::kData).ok());
  EXPECT_EQ(device.counters().host_to_device(CopyKind::kModel), 40);
  EXPECT_EQ(device.counters().device_to_host(CopyKind::kModel), 24);
  EXPECT_EQ(device.counters().host_to_device(CopyKind::kData), 8);
  device.ResetCounters();
  EXPECT_EQ(device.counters().host_to_device(CopyKind::kModel), 0);
}

// On a CPU device the asynchronous copies are the synchronous ones: done
// comes inline, with the data there, and the bytes are counted.
TEST(CpuDeviceTest, AsyncCopiesCompleteBeforeReturningAndAreCounted) {
  CpuDevice device(0, 1);
  std::vector<float> host(10, 2.f), on_device(10, 0.f), back(10, 0.f);
  ASSERT_TRUE(device.CopyHostToDeviceAsync(on_device.data(), host.data(), 40, CopyKind::kModel)
                  .ok());
  EXPECT_EQ(on_device, host);
  int calls = 0;
  ASSERT_TRUE(device
                  .CopyDeviceToHostAsync(back.data(), on_device.data(), 40, CopyKind::kModel,
                                         [&](absl::Status status) {
                                           EXPECT_TRUE(status.ok()) << status;
                                           EXPECT_EQ(back, host);
                                           ++calls;
                                         })
                  .ok());
  EXPECT_EQ(calls, 1);
  // Zero bytes: done all the same (the work issued so far has completed).
  ASSERT_TRUE(device
                  .CopyDeviceToHostAsync(nullptr, nullptr, 0, CopyKind::kModel,
                                         [&](absl::Status) { ++calls; })
                  .ok());
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(device.OrderAfterCopiesToHost().ok());
  EXPECT_EQ(device.counters().host_to_device(CopyKind::kModel), 40);
  EXPECT_EQ(device.counters().device_to_host(CopyKind::kModel), 40);
}

// On a GPU: a copy to host issued after device work lands after it, on the
// copy stream, and then calls done, in issue order; after
// OrderAfterCopiesToHost the compute stream may overwrite the source.
TEST(CudaDeviceTest, AsyncCopiesToHostLandAfterTheWorkIssuedBeforeThem) {
  if (CudaGpuCount() == 0) {
    GTEST_SKIP() << "no usable CUDA GPU (no driver, no device, or a --config=cpu_only build): "
                    "the CUDA device's asynchronous copies are not exercised";
  }
  auto devices = CreateDevices(*ParseDeviceSpec("cuda"));
  ASSERT_TRUE(devices.ok()) << devices.status();
  Device& device = *(*devices)[0];
  constexpr int64_t kFloats = 1 << 22;  // 16 MiB: long enough to overlap
  constexpr int64_t kBytes = kFloats * static_cast<int64_t>(sizeof(float));
  auto host_in = device.AllocateHost(kBytes);
  auto host_out = device.AllocateHost(kBytes);
  auto a = device.Allocate(kBytes);
  auto b = device.Allocate(kBytes);
  ASSERT_TRUE(host_in.ok() && host_out.ok() && a.ok() && b.ok());
  float* in = static_cast<float*>(*host_in);
  float* out = static_cast<float*>(*host_out);
  for (int64_t i = 0; i < kFloats; ++i) in[i] = static_cast<float>(i % 1000);
  std::memset(out, 0, kBytes);
  // 1. host -> a (ordered before) a -> b on the compute stream, then b ->
  // host on the copy stream, ordered after both.
  ASSERT_TRUE(device.CopyHostToDeviceAsync(*a, in, kBytes, CopyKind::kModel).ok());
  ASSERT_TRUE(device.CopyOnDevice(*b, *a, kBytes).ok());
  absl::Notification first, second;
  std::atomic<int> order{0};
  int first_at = -1, second_at = -1;
  ASSERT_TRUE(device
                  .CopyDeviceToHostAsync(out, *b, kBytes, CopyKind::kModel,
                                         [&](absl::Status status) {
                                           EXPECT_TRUE(status.ok()) << status;
                                           first_at = order++;
                                           first.Notify();
                                         })
                  .ok());
  ASSERT_TRUE(device
                  .CopyDeviceToHostAsync(nullptr, nullptr, 0, CopyKind::kModel,
                                         [&](absl::Status) {
                                           second_at = order++;
                                           second.Notify();
                                         })
                  .ok());
  // 2. The source overwritten after the copies: they keep what they read.
  ASSERT_TRUE(device.OrderAfterCopiesToHost().ok());
  ASSERT_TRUE(device.Memzero(*b, kBytes).ok());
  first.WaitForNotification();
  second.WaitForNotification();
  ASSERT_TRUE(device.Synchronize().ok());
  EXPECT_EQ(first_at, 0);
  EXPECT_EQ(second_at, 1);
  EXPECT_EQ(std::memcmp(in, out, kBytes), 0);
  EXPECT_EQ(device.counters().host_to_device(CopyKind::kModel), kBytes);
  EXPECT_EQ(device.counters().device_to_host(CopyKind::kModel), kBytes);
  device.Deallocate(*a);
  device.Deallocate(*b);
  device.DeallocateHost(in);
  device.DeallocateHost(out);
}

}  // namespace
}  // namespace ps
