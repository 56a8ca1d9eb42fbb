#include "common/process_tuning.h"

#include <malloc.h>

#include "absl/synchronization/mutex.h"

namespace ps {

void TuneMallocForLargeMessages() {
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  // Do not give freed heap memory back to the OS after every large free.
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
}

void DisableMutexDeadlockDetection() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace ps
