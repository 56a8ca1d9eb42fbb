#ifndef PS_COMMON_FAKE_DEVICE_H_
#define PS_COMMON_FAKE_DEVICE_H_

// A test double for a device whose memory is not host memory (a CUDA
// device), on a machine without one.

#include "common/cpu_device.h"

namespace ps {

// A CPU device that says its memory is not host memory: code that asks
// is_host_memory() treats it as it treats a CUDA device (host staging
// buffers, one counted copy each way, no pushes from its memory), while its
// kernels are the CPU ones, so a test compares that path with a CpuDevice's
// on the same arithmetic, bit for bit. Its memory is host memory all the
// same, so a test that forgets a copy reads stale data instead of crashing:
// check the copy counters too.
class StagedCpuDevice final : public CpuDevice {
 public:
  using CpuDevice::CpuDevice;
  bool is_host_memory() const override { return false; }
};

}  // namespace ps

#endif  // PS_COMMON_FAKE_DEVICE_H_
