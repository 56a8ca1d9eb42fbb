#ifndef PS_SERVER_JOB_PROGRESS_H_
#define PS_SERVER_JOB_PROGRESS_H_

// Where a job stands, as ParameterServer::progress() reports it: what stall
// reports (stall_report.h), the job supervisor and the worker-loss policies
// read, without depending on the server itself. Times are the server
// clock's readings in nanoseconds (-1: never).

#include <cstdint>
#include <string>
#include <vector>

namespace ps::server {

struct WorkerProgress {
  int rank = 0;
  std::string id;             // empty: no worker holds the rank
  int64_t heard_ns = -1;      // last Register, Push or Heartbeat
  int64_t pushed_chunks = 0;  // of the iteration in progress
  // The first iteration from the version on that the rank has not pushed
  // whole: the step it is at (up to the policy's Window() - 1 ahead).
  int64_t next_iteration = 0;
  int64_t last_push_iteration = -1;  // the latest it pushed any of
  int64_t last_push_ns = -1;
  bool dropped = false;  // out of the job (DropWorker), not expected
};

struct JobProgress {
  int64_t version = 0;
  bool initialized = false;  // version 0 exists
  int64_t version_ns = -1;   // when `version` was published (or the server started)
  int64_t total_chunks = 0;  // a whole push, in chunks
  std::vector<WorkerProgress> workers;  // by rank
};

}  // namespace ps::server

#endif  // PS_SERVER_JOB_PROGRESS_H_
