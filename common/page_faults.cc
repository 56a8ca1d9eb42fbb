#include "common/page_faults.h"

#include <sys/resource.h>

namespace ps {

int64_t ProcessMinorFaults() {
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return -1;
  return static_cast<int64_t>(usage.ru_minflt);
}

}  // namespace ps
