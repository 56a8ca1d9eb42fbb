#ifndef PS_COMMON_PAGE_FAULTS_H_
#define PS_COMMON_PAGE_FAULTS_H_

// Counting minor page faults: the kernel handing a process a fresh page on
// its first touch (zero-filled), which on this project's VMs costs about as
// much as copying the page. Received tensor bytes that land in memory
// reused across steps fault nothing in steady state; a step that faults
// about one page per 4 KiB received is paying for fresh memory each time.

#include <cstdint>

namespace ps {

// Minor page faults of the whole process so far (getrusage's ru_minflt),
// or -1 where the count cannot be read. Thread-safe.
int64_t ProcessMinorFaults();

// Faults per step: Step() marks the end of a step and returns the faults
// since the previous mark (the first mark: since construction). Not
// thread-safe; one owner marks the steps.
class FaultsPerStep {
 public:
  FaultsPerStep() : last_(ProcessMinorFaults()) {}
  int64_t Step() {
    const int64_t now = ProcessMinorFaults();
    const int64_t faults = now - last_;
    last_ = now;
    return faults;
  }

 private:
  int64_t last_;
};

}  // namespace ps

#endif  // PS_COMMON_PAGE_FAULTS_H_
