#include "common/device.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ps {

absl::Status Device::CopyHostToDevice(void* device_dst, const void* host_src, int64_t bytes,
                                      CopyKind kind) {
  PS_RETURN_IF_ERROR(DoCopyHostToDevice(device_dst, host_src, bytes));
  counters_.host_to_device_bytes[static_cast<int>(kind)] += bytes;
  return absl::OkStatus();
}

absl::Status Device::CopyDeviceToHost(void* host_dst, const void* device_src, int64_t bytes,
                                      CopyKind kind) {
  PS_RETURN_IF_ERROR(DoCopyDeviceToHost(host_dst, device_src, bytes));
  counters_.device_to_host_bytes[static_cast<int>(kind)] += bytes;
  return absl::OkStatus();
}

absl::Status Device::CopyDeviceToHostAsync(void* host_dst, const void* device_src, int64_t bytes,
                                           CopyKind kind, CopyDone done) {
  PS_RETURN_IF_ERROR(DoCopyDeviceToHostAsync(host_dst, device_src, bytes, std::move(done)));
  counters_.device_to_host_bytes[static_cast<int>(kind)] += bytes;
  return absl::OkStatus();
}

absl::Status Device::CopyHostToDeviceAsync(void* device_dst, const void* host_src, int64_t bytes,
                                           CopyKind kind) {
  PS_RETURN_IF_ERROR(DoCopyHostToDeviceAsync(device_dst, host_src, bytes));
  counters_.host_to_device_bytes[static_cast<int>(kind)] += bytes;
  return absl::OkStatus();
}

absl::Status Device::DoCopyDeviceToHostAsync(void* dst, const void* src, int64_t bytes,
                                             CopyDone done) {
  if (bytes > 0) PS_RETURN_IF_ERROR(DoCopyDeviceToHost(dst, src, bytes));
  done(absl::OkStatus());
  return absl::OkStatus();
}

absl::StatusOr<void*> Device::Scratch(int slot, int64_t bytes) {
  if (slot < 0 || slot >= kScratchSlots) {
    return absl::InvalidArgumentError(absl::StrCat("scratch slot ", slot, " out of range"));
  }
  if (bytes > scratch_bytes_[slot]) {
    Deallocate(scratch_[slot]);
    scratch_[slot] = nullptr;
    scratch_bytes_[slot] = 0;
    // Grow by at least 1.5x so slowly growing requests do not reallocate often.
    const int64_t grown = std::max(bytes, scratch_bytes_[slot] + scratch_bytes_[slot] / 2);
    PS_ASSIGN_OR_RETURN(scratch_[slot], Allocate(grown));
    scratch_bytes_[slot] = grown;
  }
  return scratch_[slot];
}

void Device::ReleaseScratch() {
  for (int i = 0; i < kScratchSlots; ++i) {
    Deallocate(scratch_[i]);
    scratch_[i] = nullptr;
    scratch_bytes_[i] = 0;
  }
}

}  // namespace ps
