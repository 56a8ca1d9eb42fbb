#include "common/devices.h"

#include <atomic>
#include <vector>

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

}  // namespace
}  // namespace ps
