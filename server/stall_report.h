#ifndef PS_SERVER_STALL_REPORT_H_
#define PS_SERVER_STALL_REPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "server/job_progress.h"

namespace ps::server {

// What a waiting job is waiting for (Horovod's stall inspector, for a
// parameter server): from a ParameterServer's progress, which ranks the
// iteration in progress still needs, since when, and what each last did.
struct Stall {
  int64_t iteration = 0;
  absl::Duration waited;        // since the iteration's version was published
  std::vector<int> missing;     // ranks that have not pushed all of it
  std::vector<int> lost;        // of those, the ones not heard from within the liveness timeout
  std::string report;           // one line naming all of that; "" when not stalled
};

// The stall of `progress` at clock time `now_ns`: stalled when version 0
// exists, the version has not moved for `report_after`, some rank has not
// pushed the whole iteration (or is not registered), and somebody waits for
// it: another rank has pushed it all, or it is lost (while every rank is
// still computing a slow step, nothing stalls). A rank is lost
// when it is registered and nothing was heard from it for
// `liveness_timeout`, or its slot is empty.
Stall FindStall(const JobProgress& progress, int64_t now_ns,
                absl::Duration report_after, absl::Duration liveness_timeout);

}  // namespace ps::server

#endif  // PS_SERVER_STALL_REPORT_H_
