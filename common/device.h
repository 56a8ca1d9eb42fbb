#ifndef PS_COMMON_DEVICE_H_
#define PS_COMMON_DEVICE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/precision.h"

namespace ps {

enum class DeviceType { kCpu, kCuda };

// What a host<->device copy carries, so the copy layer can count model
// traffic (parameters and gradients: one model's worth each way per step is
// the target) apart from input batches and metric read-backs.
enum class CopyKind : int { kModel = 0, kData = 1, kOther = 2 };
constexpr int kNumCopyKinds = 3;

// Bytes moved across the host link, by kind, counted by the copy layer.
struct CopyCounters {
  std::atomic<int64_t> host_to_device_bytes[kNumCopyKinds] = {};
  std::atomic<int64_t> device_to_host_bytes[kNumCopyKinds] = {};

  int64_t host_to_device(CopyKind kind) const {
    return host_to_device_bytes[static_cast<int>(kind)].load();
  }
  int64_t device_to_host(CopyKind kind) const {
    return device_to_host_bytes[static_cast<int>(kind)].load();
  }
};

// A place where tensors live and kernels run: a CPU device (a share of the
// host's cores) or a CUDA device (one stream on one GPU; several logical CUDA
// devices may share a GPU).
//
// Ordering: kernels and copies issued to one device execute in issue order.
// On CUDA they are asynchronous with respect to the host, except the copies
// to and from host memory, which return once the host buffer may be reused.
// On CPU everything completes before the call returns.
//
// Thread safety: Allocate/Deallocate and the counters are thread-safe. Work
// for one device should be issued from one thread at a time (the device's
// replica thread); different devices may be driven concurrently.
class Device {
 public:
  virtual ~Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  DeviceType type() const { return type_; }
  bool is_cpu() const { return type_ == DeviceType::kCpu; }
  bool is_cuda() const { return type_ == DeviceType::kCuda; }
  // Whether this device's memory is host memory, which the host may read
  // and write directly: then a host buffer and a device buffer are the same
  // kind of memory, and a copy between them is one that need not exist (the
  // trainer pushes from a CPU device's gradients and pulls into its
  // parameters where they lie). True for CPU devices, false for CUDA
  // devices, whose pointers the host may not dereference.
  virtual bool is_host_memory() const { return false; }
  // "cpu:0", "cuda:1". Unique among the devices of a process.
  const std::string& name() const { return name_; }

  // Device memory, 64-byte aligned, uninitialised. kResourceExhausted when
  // the device is out of memory. `bytes` may be 0 (returns nullptr).
  virtual absl::StatusOr<void*> Allocate(int64_t bytes) = 0;
  virtual void Deallocate(void* ptr) = 0;

  // Host memory suited to copies with this device: page-locked on CUDA, so a
  // copy runs at full link speed and without a staging copy; ordinary aligned
  // memory on CPU. Release with DeallocateHost.
  virtual absl::StatusOr<void*> AllocateHost(int64_t bytes) = 0;
  virtual void DeallocateHost(void* ptr) = 0;

  // Copies between host memory and this device's memory, ordered after all
  // work issued earlier to this device. Returns once the copy has completed.
  // Counted in counters() under `kind`.
  absl::Status CopyHostToDevice(void* device_dst, const void* host_src, int64_t bytes,
                                CopyKind kind = CopyKind::kOther);
  absl::Status CopyDeviceToHost(void* host_dst, const void* device_src, int64_t bytes,
                                CopyKind kind = CopyKind::kOther);
  // Asynchronous copies of the model, for overlapping communication with
  // compute (worker/device_overlap.h). Counted like the copies above.
  //
  // CopyDeviceToHostAsync: copies `bytes` from `device_src` to `host_dst`
  // (from AllocateHost) once all work issued to this device so far has
  // completed, without making the caller wait for that work, then calls
  // done(status) with the copy's status: inline on devices whose work
  // completes before each call returns (CPU), on a thread of the CUDA
  // runtime on CUDA devices (after the copy has landed, on a second stream,
  // so later kernels run on while it copies). `done` calls no Device and no
  // CUDA API and returns soon (it holds up the done of later copies); the
  // done of one device's copies run one at a time, in issue order. `bytes`
  // may be 0: done then says that the work issued so far has completed. An
  // error issuing the copy is returned and done is not called. Later work
  // issued to this device may overwrite `device_src` only after
  // OrderAfterCopiesToHost.
  using CopyDone = std::function<void(absl::Status)>;
  absl::Status CopyDeviceToHostAsync(void* host_dst, const void* device_src, int64_t bytes,
                                     CopyKind kind, CopyDone done);
  // Work issued from now on starts after every CopyDeviceToHostAsync issued
  // so far has read its source. The caller does not wait (on CUDA the
  // compute stream waits for the copy stream).
  virtual absl::Status OrderAfterCopiesToHost() { return absl::OkStatus(); }
  // Copies `bytes` from `host_src` (from AllocateHost) to `device_dst`,
  // ordered after all work issued so far and before all work issued later;
  // returns once issued (on CPU: once done). `host_src` must not change
  // until the work issued after it has completed (the done of a later
  // CopyDeviceToHostAsync, or Synchronize, says so).
  absl::Status CopyHostToDeviceAsync(void* device_dst, const void* host_src, int64_t bytes,
                                     CopyKind kind);

  // Copies within this device's memory, asynchronous on CUDA. Not counted.
  virtual absl::Status CopyOnDevice(void* dst, const void* src, int64_t bytes) = 0;
  // Sets `bytes` bytes at `dst` to zero, asynchronous on CUDA.
  virtual absl::Status Memzero(void* dst, int64_t bytes) = 0;

  // Blocks until all work issued to this device has finished; reports any
  // asynchronous error raised by that work.
  virtual absl::Status Synchronize() = 0;

  // A scratch buffer of at least `bytes` bytes in device memory, for kernels'
  // temporaries (im2col columns, reduction partials). There are kScratchSlots
  // independent slots; a buffer stays valid until the next Scratch call with
  // the same slot on this device, and its contents are undefined. Because all
  // work on a device is ordered, a kernel may reuse a slot that an earlier
  // kernel used. Not thread-safe: call from the thread driving this device.
  // Slots 4 and 5 hold a half-precision GEMM's rounded operands on CUDA
  // (gemm.h), so that GEMMs may read operands kernels built in slots 0-3.
  static constexpr int kScratchSlots = 6;
  absl::StatusOr<void*> Scratch(int slot, int64_t bytes);

  // The precision of every matrix multiply on this device (see
  // common/precision.h): GEMMs, and the convolutions built on them. Set once,
  // before work is issued (the trainer sets `--precision`); kFp32 until then.
  Precision gemm_precision() const { return gemm_precision_; }
  void set_gemm_precision(Precision precision) { gemm_precision_ = precision; }

  const CopyCounters& counters() const { return counters_; }
  void ResetCounters() {
    for (int k = 0; k < kNumCopyKinds; ++k) {
      counters_.host_to_device_bytes[k] = 0;
      counters_.device_to_host_bytes[k] = 0;
    }
  }

 protected:
  Device(DeviceType type, std::string name) : type_(type), name_(std::move(name)) {}

  virtual absl::Status DoCopyHostToDevice(void* dst, const void* src, int64_t bytes) = 0;
  virtual absl::Status DoCopyDeviceToHost(void* dst, const void* src, int64_t bytes) = 0;
  // The asynchronous copies. By default the synchronous ones, done called
  // inline: right for devices whose work completes before each call returns.
  virtual absl::Status DoCopyDeviceToHostAsync(void* dst, const void* src, int64_t bytes,
                                               CopyDone done);
  virtual absl::Status DoCopyHostToDeviceAsync(void* dst, const void* src, int64_t bytes) {
    return DoCopyHostToDevice(dst, src, bytes);
  }

 private:
  const DeviceType type_;
  const std::string name_;
  CopyCounters counters_;
  Precision gemm_precision_ = Precision::kFp32;
  void* scratch_[kScratchSlots] = {};
  int64_t scratch_bytes_[kScratchSlots] = {};

 protected:
  // Subclasses call this first in their destructor, while Deallocate works.
  void ReleaseScratch();
};

}  // namespace ps

#endif  // PS_COMMON_DEVICE_H_
