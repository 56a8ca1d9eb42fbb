#include "worker/device_overlap.h"

#include <memory>

namespace ps::worker {

class DeviceOverlap::Hooks final : public model::ParameterHooks {
 public:
  explicit Hooks(DeviceOverlap* overlap) : overlap_(overlap) {}

  absl::Status BeforeForward(int64_t begin, int64_t end) override {
    return overlap_->CopyParameters(begin, end);
  }
  void GradientsReady(int64_t begin, int64_t end) override { overlap_->Report(begin); }
  void AfterBackward(int64_t begin, int64_t end) override { overlap_->Report(begin); }

 private:
  DeviceOverlap* const overlap_;
};

DeviceOverlap::DeviceOverlap(Device* device, float* device_gradients, float* device_parameters,
                             float* host_gradients, const float* host_parameters,
                             int64_t num_parameters)
    : device_(device),
      device_gradients_(device_gradients),
      device_parameters_(device_parameters),
      host_gradients_(host_gradients),
      host_parameters_(host_parameters),
      num_parameters_(num_parameters),
      hooks_(std::make_unique<Hooks>(this)),
      copied_from_(num_parameters) {}

DeviceOverlap::~DeviceOverlap() {
  if (device_failed_ || !device_->Synchronize().ok()) return;
  AwaitCopies().IgnoreError();
}

model::ParameterHooks* DeviceOverlap::hooks() { return hooks_.get(); }

absl::Status DeviceOverlap::Error() {
  absl::MutexLock lock(&mu_);
  return error_;
}

absl::Status DeviceOverlap::BeginStep(PushPullScheduler* scheduler) {
  if (absl::Status s = Error(); !s.ok()) return s;
  // This step's backward overwrites the gradients the last step's copies
  // read (landed already: FinishStep waited, but the device need not know).
  if (absl::Status s = device_->OrderAfterCopiesToHost(); !s.ok()) return s;
  {
    absl::MutexLock lock(&mu_);
    scheduler_ = scheduler;
  }
  copied_from_ = num_parameters_;
  copy_parameters_ = !parameters_current_;
  parameters_current_ = false;
  return absl::OkStatus();
}

absl::Status DeviceOverlap::CopyParameters(int64_t begin, int64_t end) {
  if (absl::Status s = Error(); !s.ok()) return s;
  PushPullScheduler* scheduler;
  {
    absl::MutexLock lock(&mu_);
    scheduler = scheduler_;
  }
  if (absl::Status s = scheduler->AwaitParameters(begin, end); !s.ok()) return s;
  if (!copy_parameters_ || end <= begin) return absl::OkStatus();
  return device_->CopyHostToDeviceAsync(device_parameters_ + begin, host_parameters_ + begin,
                                        (end - begin) * static_cast<int64_t>(sizeof(float)),
                                        CopyKind::kModel);
}

void DeviceOverlap::Report(int64_t offset) {
  if (offset >= copied_from_) return;
  const int64_t end = copied_from_;
  copied_from_ = offset;
  {
    absl::MutexLock lock(&mu_);
    ++pending_;
  }
  // On a CPU device done runs inline, before the call returns: no lock held.
  const absl::Status issued = device_->CopyDeviceToHostAsync(
      host_gradients_ + offset, device_gradients_ + offset,
      (end - offset) * static_cast<int64_t>(sizeof(float)), CopyKind::kModel,
      [this, offset](absl::Status status) { Landed(offset, status); });
  if (!issued.ok()) Landed(offset, issued);
}

void DeviceOverlap::Landed(int64_t offset, const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (!status.ok() && error_.ok()) error_ = status;
  // After an error nothing more is handed over: the step fails.
  if (error_.ok()) scheduler_->GradientsReadyFrom(offset);
  --pending_;
}

absl::Status DeviceOverlap::FinishStep() {
  // Whatever the layers did not hand over (everything, for a pass that
  // called no hook), ending with GradientsReadyFrom(0).
  Report(0);
  // The device's own errors first: after a failure its copies' done may
  // never come.
  if (absl::Status s = device_->Synchronize(); !s.ok()) {
    device_failed_ = true;
    return s;
  }
  return AwaitCopies();
}

absl::Status DeviceOverlap::AwaitCopies() {
  if (device_failed_) return absl::FailedPreconditionError("the device has failed");
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* pending) { return *pending == 0; }, &pending_));
  return error_;
}

}  // namespace ps::worker
