#include "common/process_tuning.h"

#include <gperftools/malloc_extension.h>

#include "absl/synchronization/mutex.h"

namespace ps {

void TuneMallocForLargeMessages() {
  // Freed pages stay in the page heap for the next step's messages.
  MallocExtension::instance()->SetMemoryReleaseRate(0);
}

sigset_t BlockStopSignals() {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  return stop_signals;
}

void DisableMutexDeadlockDetection() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace ps
