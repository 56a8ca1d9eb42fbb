#include "worker/device_threads.h"

#include <utility>

namespace ps::worker {

DeviceThreads::DeviceThreads(int num_devices)
    : num_devices_(num_devices < 1 ? 1 : num_devices) {
  if (num_devices_ == 1) return;
  {
    absl::MutexLock lock(&mu_);
    statuses_.resize(num_devices_);
  }
  threads_.reserve(num_devices_);
  for (int d = 0; d < num_devices_; ++d) threads_.emplace_back([this, d] { Loop(d); });
}

DeviceThreads::~DeviceThreads() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

absl::Status DeviceThreads::RunOnAll(absl::FunctionRef<absl::Status(int)> fn) {
  if (num_devices_ == 1) return fn(0);
  absl::MutexLock run_lock(&run_mu_);
  absl::MutexLock lock(&mu_);
  // 1. Publish the call; every lane sees the new generation and takes it.
  job_ = &fn;
  for (absl::Status& s : statuses_) s = absl::OkStatus();
  pending_ = num_devices_;
  ++generation_;
  // 2. Wait until the last lane has finished (fn is not touched after that).
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_ == 0; };
  mu_.Await(absl::Condition(&done));
  job_ = nullptr;
  // 3. The first failure in device order.
  for (absl::Status& s : statuses_) {
    if (!s.ok()) return std::move(s);
  }
  return absl::OkStatus();
}

void DeviceThreads::Loop(int device) {
  int64_t seen = 0;
  for (;;) {
    const absl::FunctionRef<absl::Status(int)>* job;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this, &seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || generation_ != seen;
      };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) return;
      seen = generation_;
      job = job_;
    }
    absl::Status status = (*job)(device);
    absl::MutexLock lock(&mu_);
    statuses_[device] = std::move(status);
    --pending_;
  }
}

}  // namespace ps::worker
