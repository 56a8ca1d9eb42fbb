#include "worker/collective.h"

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/devices.h"
#include "common/tensor.h"
#include "gtest/gtest.h"
#include "kernels/elementwise.h"
#include "kernels/test_util.h"
#include "worker/device_threads.h"

#ifdef PS_WITH_CUDA
#include "worker/nccl_collective.h"
#endif

namespace ps::worker {
namespace {

using kernels::testing::AllClose;
using kernels::testing::RandomVector;

#define PS_SKIP_WITHOUT_CUDA_GPU()                                                        \
  do {                                                                                    \
    if (::ps::CudaGpuCount() == 0) {                                                      \
      GTEST_SKIP() << "no usable CUDA GPU: no driver, no device, or a --config=cpu_only " \
                      "build; the CUDA collective is not exercised";                      \
    }                                                                                     \
  } while (false)

// The devices a --devices spec names (CPU devices get one thread each), one
// fp32 buffer of n elements on each, and the collective for them. Buffers go
// before the devices they live on.
struct Replicas {
  std::vector<std::unique_ptr<Device>> devices;
  std::vector<Tensor> tensors;
  std::unique_ptr<DeviceThreads> threads;
  std::unique_ptr<DeviceCollective> collective;

  std::vector<Tensor*> buffers() {
    std::vector<Tensor*> out;
    for (Tensor& t : tensors) out.push_back(&t);
    return out;
  }
  std::vector<Device*> device_list() const {
    std::vector<Device*> out;
    for (const auto& d : devices) out.push_back(d.get());
    return out;
  }
  ~Replicas() {
    collective.reset();
    tensors.clear();
  }
};

// Fills `setup` for `spec_text`; buffer d holds data[d]. Fails the test (and
// returns false) on any error.
bool MakeReplicas(const std::string& spec_text, const std::vector<std::vector<float>>& data,
                  Replicas* setup) {
  auto spec = ParseDeviceSpec(spec_text);
  if (!spec.ok()) {
    ADD_FAILURE() << spec.status();
    return false;
  }
  auto devices = CreateDevices(*spec, /*cpu_threads=*/spec->count);
  if (!devices.ok()) {
    ADD_FAILURE() << spec_text << ": " << devices.status();
    return false;
  }
  setup->devices = std::move(devices).value();
  if (setup->devices.size() != data.size()) {
    ADD_FAILURE() << spec_text << " made " << setup->devices.size() << " devices, want "
                  << data.size();
    return false;
  }
  for (size_t d = 0; d < data.size(); ++d) {
    auto t =
        Tensor::FromHost(setup->devices[d].get(), {static_cast<int64_t>(data[d].size())}, data[d]);
    if (!t.ok()) {
      ADD_FAILURE() << t.status();
      return false;
    }
    setup->tensors.push_back(std::move(t).value());
  }
  setup->threads = std::make_unique<DeviceThreads>(static_cast<int>(data.size()));
  auto collective = DeviceCollective::Create(setup->device_list(), setup->threads.get());
  if (!collective.ok()) {
    ADD_FAILURE() << spec_text << ": " << collective.status();
    return false;
  }
  setup->collective = std::move(collective).value();
  return true;
}

std::vector<std::vector<float>> RandomBuffers(int d_count, int64_t n, uint64_t seed) {
  std::vector<std::vector<float>> data;
  for (int d = 0; d < d_count; ++d) data.push_back(RandomVector(n, seed + d));
  return data;
}

// buffers[0] + buffers[1] + ..., summed in index order in fp32: the order of
// the CPU collective and of logical devices on one GPU.
std::vector<float> SumInOrder(const std::vector<std::vector<float>>& data) {
  std::vector<float> sum = data[0];
  for (size_t d = 1; d < data.size(); ++d) {
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += data[d][i];
  }
  return sum;
}

std::vector<float> ToHost(const Tensor& t) {
  auto v = t.ToVector();
  EXPECT_TRUE(v.ok()) << v.status();
  return v.ok() ? *v : std::vector<float>();
}

const int64_t kSizes[] = {0, 1, 7, 1001, 4097};

TEST(CpuCollectiveTest, ReduceSumsEveryDeviceIntoTheRoot) {
  for (int d_count : {1, 2, 3}) {
    for (int64_t n : kSizes) {
      SCOPED_TRACE(absl::StrCat(d_count, " devices, ", n, " elements"));
      const auto data = RandomBuffers(d_count, n, 10 * n + d_count);
      Replicas s;
      ASSERT_TRUE(MakeReplicas(absl::StrCat("cpu:", d_count), data, &s));
      ASSERT_TRUE(s.collective->ReduceSumToRoot(s.buffers()).ok());
      EXPECT_EQ(ToHost(s.tensors[0]), SumInOrder(data));
    }
  }
}

TEST(CpuCollectiveTest, BroadcastCopiesTheRootToEveryDevice) {
  for (int d_count : {1, 2, 3}) {
    for (int64_t n : kSizes) {
      SCOPED_TRACE(absl::StrCat(d_count, " devices, ", n, " elements"));
      const auto data = RandomBuffers(d_count, n, 20 * n + d_count);
      Replicas s;
      ASSERT_TRUE(MakeReplicas(absl::StrCat("cpu:", d_count), data, &s));
      ASSERT_TRUE(s.collective->BroadcastFromRoot(s.buffers()).ok());
      for (int d = 0; d < d_count; ++d) EXPECT_EQ(ToHost(s.tensors[d]), data[0]) << "device " << d;
    }
  }
}

TEST(CollectiveTest, RejectsBadArguments) {
  DeviceThreads one_lane(1);
  EXPECT_EQ(DeviceCollective::Create({}, &one_lane).status().code(),
            absl::StatusCode::kInvalidArgument);

  Replicas s;
  ASSERT_TRUE(MakeReplicas("cpu:2", RandomBuffers(2, 5, 1), &s));
  std::vector<Tensor*> one = {&s.tensors[0]};
  EXPECT_EQ(s.collective->ReduceSumToRoot(one).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.collective->BroadcastFromRoot(one).code(), absl::StatusCode::kInvalidArgument);
  auto shorter = Tensor::Zeros(s.devices[1].get(), {4});
  ASSERT_TRUE(shorter.ok());
  std::vector<Tensor*> mismatched = {&s.tensors[0], &*shorter};
  EXPECT_EQ(s.collective->ReduceSumToRoot(mismatched).code(), absl::StatusCode::kInvalidArgument);
  // One device thread per device, no fewer, no more, and not none.
  EXPECT_EQ(DeviceCollective::Create(s.device_list(), nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DeviceCollective::Create(s.device_list(), &one_lane).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The slices run on the device threads the collective was given, so a step
// starts no threads: each slice lands on its device's stable lane.
TEST(CpuCollectiveTest, RunsItsSlicesOnTheGivenDeviceThreads) {
  Replicas s;
  ASSERT_TRUE(MakeReplicas("cpu:3", RandomBuffers(3, 1001, 5), &s));
  std::vector<std::thread::id> lanes(3);
  ASSERT_TRUE(s.threads
                  ->RunOnAll([&](int d) {
                    lanes[d] = std::this_thread::get_id();
                    return absl::OkStatus();
                  })
                  .ok());
  for (int call = 0; call < 3; ++call) {
    ASSERT_TRUE(s.collective->ReduceSumToRoot(s.buffers()).ok());
    ASSERT_TRUE(s.collective->BroadcastFromRoot(s.buffers()).ok());
  }
  std::vector<std::thread::id> again(3);
  ASSERT_TRUE(s.threads
                  ->RunOnAll([&](int d) {
                    again[d] = std::this_thread::get_id();
                    return absl::OkStatus();
                  })
                  .ok());
  EXPECT_EQ(again, lanes) << "the collective's calls left the lanes where they were";
}

// The --devices specs to run the CUDA collective on: logical devices sharing
// GPU 0 always, several GPUs (with device 0 on another GPU than 0, and GPUs
// holding several logical devices) when present.
std::vector<std::string> GpuSpecs() {
  std::vector<std::string> specs = {"cuda:0,0", "cuda:0,0,0"};
  if (CudaGpuCount() >= 2) {
    for (const char* s : {"cuda:0,1", "cuda:0,1,0", "cuda:1,0,1", "cuda:1,1,0,0"}) {
      specs.push_back(s);
    }
  }
  if (CudaGpuCount() >= 3) specs.push_back("cuda:0,1,2");
  return specs;
}

// Whether every device of a CUDA spec is on the same GPU.
bool OnOneGpu(const std::string& spec_text) {
  auto spec = ParseDeviceSpec(spec_text);
  if (!spec.ok()) return false;
  for (int id : spec->gpu_ids) {
    if (id != spec->gpu_ids[0]) return false;
  }
  return true;
}

TEST(NcclCollectiveTest, ReduceMatchesTheCpuCollective) {
  PS_SKIP_WITHOUT_CUDA_GPU();
  for (const std::string& spec : GpuSpecs()) {
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1001}, int64_t{(1 << 20) + 3}}) {
      SCOPED_TRACE(absl::StrCat(spec, ", ", n, " elements"));
      Replicas gpu;
      auto parsed = ParseDeviceSpec(spec);
      ASSERT_TRUE(parsed.ok());
      const int d_count = static_cast<int>(parsed->gpu_ids.size());
      const auto data = RandomBuffers(d_count, n, 30 * n + d_count);
      ASSERT_TRUE(MakeReplicas(spec, data, &gpu));
      Replicas cpu;
      ASSERT_TRUE(MakeReplicas(absl::StrCat("cpu:", d_count), data, &cpu));

      ASSERT_TRUE(gpu.collective->ReduceSumToRoot(gpu.buffers()).ok());
      ASSERT_TRUE(cpu.collective->ReduceSumToRoot(cpu.buffers()).ok());
      const std::vector<float> got = ToHost(gpu.tensors[0]);
      const std::vector<float> want = ToHost(cpu.tensors[0]);
      if (OnOneGpu(spec)) {
        // Same summation order as the CPU collective: bit for bit.
        EXPECT_EQ(got, want);
      } else {
        EXPECT_TRUE(AllClose(got, want, 1e-5f, 1e-5f));
      }
    }
  }
}

TEST(NcclCollectiveTest, BroadcastMatchesTheCpuCollective) {
  PS_SKIP_WITHOUT_CUDA_GPU();
  for (const std::string& spec : GpuSpecs()) {
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1001}, int64_t{(1 << 20) + 3}}) {
      SCOPED_TRACE(absl::StrCat(spec, ", ", n, " elements"));
      auto parsed = ParseDeviceSpec(spec);
      ASSERT_TRUE(parsed.ok());
      const int d_count = static_cast<int>(parsed->gpu_ids.size());
      const auto data = RandomBuffers(d_count, n, 40 * n + d_count);
      Replicas gpu;
      ASSERT_TRUE(MakeReplicas(spec, data, &gpu));
      ASSERT_TRUE(gpu.collective->BroadcastFromRoot(gpu.buffers()).ok());
      for (int d = 0; d < d_count; ++d) {
        EXPECT_EQ(ToHost(gpu.tensors[d]), data[0]) << "device " << d;
      }
    }
  }
}

// Host-side check that every element of `t` is `value`; names the first
// element that is not.
void ExpectAllEqual(const Tensor& t, float value, const std::string& what) {
  const std::vector<float> v = ToHost(t);
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] != value) {
      ADD_FAILURE() << what << ": element " << i << " is " << v[i] << ", want " << value;
      return;
    }
  }
}

// Queues `times` fills of t with `value` on t's device, without waiting: a
// long stretch of work on that stream.
void QueueFills(Tensor& t, float value, int times) {
  for (int i = 0; i < times; ++i) {
    ASSERT_TRUE(kernels::Fill(*t.device(), t.num_elements(), value, t.mutable_data<float>()).ok());
  }
}

void SetAndWait(Replicas& s, float value_base) {
  for (size_t d = 0; d < s.tensors.size(); ++d) QueueFills(s.tensors[d], value_base + d, 1);
  for (auto& d : s.devices) ASSERT_TRUE(d->Synchronize().ok());
}

// The collectives are ordered against work queued on every device's stream,
// before and after, with no host synchronisation in between. The devices'
// streams are kept busy (many large fills) so that a missing event wait
// would show up as a wrong value.
TEST(NcclCollectiveTest, OrderedAgainstQueuedWorkWithoutHostSync) {
  PS_SKIP_WITHOUT_CUDA_GPU();
  constexpr int64_t kN = int64_t{1} << 24;  // 64 MiB per buffer
  constexpr int kBusy = 50;
  std::vector<std::string> specs = {"cuda:0,0", "cuda:0,0,0"};
  if (CudaGpuCount() >= 2) specs.push_back("cuda:0,1,0");
  for (const std::string& spec : specs) {
    SCOPED_TRACE(spec);
    auto parsed = ParseDeviceSpec(spec);
    ASSERT_TRUE(parsed.ok());
    const int d_count = static_cast<int>(parsed->gpu_ids.size());
    Replicas s;
    ASSERT_TRUE(
        MakeReplicas(spec, std::vector<std::vector<float>>(d_count, std::vector<float>(kN)), &s));
    const float sum = d_count * (d_count + 1) / 2.f;  // 1 + 2 + ... + D

    // (a) The reduce reads each member's buffer after the member's queued
    //     writes.
    SetAndWait(s, -100.f);
    for (int d = 1; d < d_count; ++d) QueueFills(s.tensors[d], d + 1.f, kBusy);
    QueueFills(s.tensors[0], 1.f, 1);
    ASSERT_TRUE(s.collective->ReduceSumToRoot(s.buffers()).ok());
    ExpectAllEqual(s.tensors[0], sum, "reduce after members' queued writes");

    // (b) A member's writes queued after the reduce wait for its reads.
    SetAndWait(s, 1.f);
    QueueFills(s.tensors[0], 1.f, kBusy);
    ASSERT_TRUE(s.collective->ReduceSumToRoot(s.buffers()).ok());
    for (int d = 1; d < d_count; ++d) QueueFills(s.tensors[d], 1000.f, 1);
    ExpectAllEqual(s.tensors[0], sum, "reduce before members' later writes");

    // (c) The broadcast copies the root after the root's queued writes.
    SetAndWait(s, -100.f);
    QueueFills(s.tensors[0], 7.f, kBusy);
    ASSERT_TRUE(s.collective->BroadcastFromRoot(s.buffers()).ok());
    for (int d = 0; d < d_count; ++d) {
      ExpectAllEqual(s.tensors[d], 7.f, absl::StrCat("broadcast to device ", d));
    }

    // (d) The root's writes queued after the broadcast wait for the copies.
    SetAndWait(s, -100.f);
    QueueFills(s.tensors[0], 7.f, 1);
    for (int d = 1; d < d_count; ++d) QueueFills(s.tensors[d], -1.f, kBusy);
    ASSERT_TRUE(s.collective->BroadcastFromRoot(s.buffers()).ok());
    QueueFills(s.tensors[0], 9.f, 1);
    for (int d = 1; d < d_count; ++d) {
      ExpectAllEqual(s.tensors[d], 7.f,
                     absl::StrCat("broadcast to device ", d, " before the root's later write"));
    }
    ExpectAllEqual(s.tensors[0], 9.f, "root after its later write");
  }
}

TEST(NcclCollectiveTest, CreateChecksTheDevices) {
  PS_SKIP_WITHOUT_CUDA_GPU();
  auto cuda = CreateDevices(*ParseDeviceSpec("cuda:0,0"));
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  auto cpu = CreateDevices(*ParseDeviceSpec("cpu"), 1);
  ASSERT_TRUE(cpu.ok());
  // A mix of device types.
  DeviceThreads two_lanes(2);
  EXPECT_EQ(DeviceCollective::Create({(*cuda)[0].get(), (*cpu)[0].get()}, &two_lanes)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  // Several CUDA devices get a collective (no longer kUnimplemented).
  auto collective = DeviceCollective::Create({(*cuda)[0].get(), (*cuda)[1].get()}, &two_lanes);
  ASSERT_TRUE(collective.ok()) << collective.status();
  // A buffer on the wrong device.
  auto a = Tensor::Zeros((*cuda)[0].get(), {3});
  auto b = Tensor::Zeros((*cuda)[0].get(), {3});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*collective)->ReduceSumToRoot({&*a, &*b}).code(), absl::StatusCode::kInvalidArgument);
  collective->reset();

#ifdef PS_WITH_CUDA
  {
    auto nccl = NcclCollective::Create({(*cuda)[0].get(), (*cuda)[1].get()});
    ASSERT_TRUE(nccl.ok()) << nccl.status();
    EXPECT_FALSE((*nccl)->uses_nccl()) << "two logical devices on one GPU need no NCCL";
    EXPECT_EQ((*nccl)->gpu_ids(), std::vector<int>({0}));
    EXPECT_EQ(NcclCollective::Create({(*cuda)[0].get(), (*cuda)[0].get()}).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  if (CudaGpuCount() >= 2) {
    auto several = CreateDevices(*ParseDeviceSpec("cuda:1,0,1"));
    ASSERT_TRUE(several.ok()) << several.status();
    std::vector<Device*> list;
    for (auto& d : *several) list.push_back(d.get());
    auto nccl = NcclCollective::Create(list);
    ASSERT_TRUE(nccl.ok()) << nccl.status();
    EXPECT_TRUE((*nccl)->uses_nccl());
    EXPECT_EQ((*nccl)->gpu_ids(), std::vector<int>({1, 0}));
  }
#endif
}

}  // namespace
}  // namespace ps::worker
