#ifndef PS_COMMON_CPU_DEVICE_H_
#define PS_COMMON_CPU_DEVICE_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "common/device.h"

namespace ps {

// A CPU device: host memory and `num_threads` cores' worth of compute. Kernels
// split their work with ParallelFor, which runs on the calling thread plus
// num_threads - 1 pool threads owned by this device, so D devices with
// cores / D threads each never oversubscribe the machine.
//
// Not final only so that a test double (common/fake_device.h) can stand in
// for a device whose memory is not host memory.
class CpuDevice : public Device {
 public:
  CpuDevice(int index, int num_threads);
  ~CpuDevice() override;

  int num_threads() const { return num_threads_; }
  bool is_host_memory() const override { return true; }

  // Calls fn(begin, end) over disjoint ranges covering [0, n), in parallel on
  // up to num_threads threads, each range at least `min_chunk` long (to keep
  // tiny loops on one thread). Returns when every call has returned. Must not
  // be called re-entrantly from inside fn.
  void ParallelFor(int64_t n, int64_t min_chunk,
                   const std::function<void(int64_t begin, int64_t end)>& fn);

  // True while the calling thread runs one of several parts of some
  // device's ParallelFor (false when the loop ran whole on its caller). Such
  // a part has one core to itself, so libraries that thread their own calls
  // (GEMM) keep them on this thread rather than oversubscribe the machine.
  static bool InParallelPart();

  absl::StatusOr<void*> Allocate(int64_t bytes) override;
  void Deallocate(void* ptr) override;
  absl::StatusOr<void*> AllocateHost(int64_t bytes) override { return Allocate(bytes); }
  void DeallocateHost(void* ptr) override { Deallocate(ptr); }
  absl::Status CopyOnDevice(void* dst, const void* src, int64_t bytes) override;
  absl::Status Memzero(void* dst, int64_t bytes) override;
  absl::Status Synchronize() override { return absl::OkStatus(); }

 protected:
  absl::Status DoCopyHostToDevice(void* dst, const void* src, int64_t bytes) override;
  absl::Status DoCopyDeviceToHost(void* dst, const void* src, int64_t bytes) override;

 private:
  void WorkerLoop(int worker);

  const int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  // The job in flight, guarded by mu_.
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int job_chunks_ = 0;
  int64_t generation_ = 0;
  int pending_ = 0;
  bool stopping_ = false;
};

// The CpuDevice behind `device`, which must be a CPU device.
inline CpuDevice& AsCpu(Device& device) { return static_cast<CpuDevice&>(device); }

}  // namespace ps

#endif  // PS_COMMON_CPU_DEVICE_H_
