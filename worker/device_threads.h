#ifndef PS_WORKER_DEVICE_THREADS_H_
#define PS_WORKER_DEVICE_THREADS_H_

// One long-lived host thread per device of a worker, so the per-device work of
// a step (each replica's forward/backward, each slice of the CPU collective's
// sum) runs on the same thread every step instead of on threads created and
// joined per call. A device's work always runs on its own lane, which is what
// a timeline's per-device rows (DeviceLane(d)) show.

#include <cstdint>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace ps::worker {

class DeviceThreads {
 public:
  // `num_devices` >= 1 lanes. With one device no thread is started and
  // RunOnAll runs inline on the caller's thread (nothing to overlap, so no
  // hand-off cost). With D > 1 every device, device 0 included, gets its own
  // thread, started here and idle (blocked on a condition, never polling)
  // between calls.
  explicit DeviceThreads(int num_devices);
  // Stops and joins every thread. Must not run concurrently with RunOnAll.
  ~DeviceThreads();

  DeviceThreads(const DeviceThreads&) = delete;
  DeviceThreads& operator=(const DeviceThreads&) = delete;

  int size() const { return num_devices_; }

  // Runs fn(d) once for every d in [0, size()), each on device d's thread,
  // concurrently, and returns when every call has returned. Always runs all
  // of them, even when some fail; returns the first non-OK status in device
  // order (so the same failure is reported whichever thread finished first),
  // OK when all succeed.
  //
  // Memory written by fn is visible to the caller once RunOnAll returns, and
  // everything the caller wrote before the call is visible to fn.
  //
  // Thread-safe: concurrent callers are served one after the other. Must not
  // be called from inside fn (the lanes are busy running it: deadlock).
  absl::Status RunOnAll(absl::FunctionRef<absl::Status(int device)> fn);

 private:
  void Loop(int device);

  const int num_devices_;
  absl::Mutex run_mu_;  // one RunOnAll at a time; taken before mu_
  absl::Mutex mu_;
  // The call in flight: valid while pending_ > 0.
  const absl::FunctionRef<absl::Status(int)>* job_ ABSL_GUARDED_BY(mu_) = nullptr;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // bumped per call
  int pending_ ABSL_GUARDED_BY(mu_) = 0;         // lanes still running the call
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<absl::Status> statuses_ ABSL_GUARDED_BY(mu_);  // per device, this call
  std::vector<std::thread> threads_;
};

}  // namespace ps::worker

#endif  // PS_WORKER_DEVICE_THREADS_H_
