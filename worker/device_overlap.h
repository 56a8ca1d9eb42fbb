#ifndef PS_WORKER_DEVICE_OVERLAP_H_
#define PS_WORKER_DEVICE_OVERLAP_H_

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/device.h"
#include "worker/model/parameter_hooks.h"
#include "worker/push_pull_scheduler.h"

namespace ps::worker {

// Overlap of communication with compute for a worker with one device whose
// memory is not host memory (a CUDA device; StagedCpuDevice in tests): the
// device's hooks, turned into asynchronous copies between its flat buffers
// and the pinned host buffers the scheduler pushes from and pulls into
// (Device::CopyDeviceToHostAsync / CopyHostToDeviceAsync).
//
// Backward: a hook saying that the gradients from an offset to the end are
// final is called when the layer's backward is issued, not done. The
// region not copied yet, [offset, previous offset), is copied to the host
// after the work issued so far (on CUDA: an event on the compute stream, a
// copy on the copy stream), and once it has landed the copy's done calls
// GradientsReadyFrom(offset): so buckets are pushed as their copies land,
// in decreasing offset order, and the host never waits for the compute
// stream during backward. Ready, not early: once a copy has landed,
// everything issued before it has run, the forward's copy of those
// parameters from the host buffer included, and the pulls write nothing
// else (the device's parameters are its own memory).
//
// Forward: before a layer's forward, the host waits for the layer's pulled
// parameters (AwaitParameters) and issues their copy to the device, ordered
// before the layer's kernels. The host range is not written again before
// that copy has run: its next pull follows its push, which follows a
// gradient copy issued after this step's forward. After
// ParametersCopied (the whole buffer copied by the caller) the next step
// copies nothing: one model each way per step.
//
// Each step: BeginStep, the pass with hooks(), FinishStep, which hands over
// what no hook covered and returns once every copy has landed and been
// handed over (the scheduler's next BeginIteration needs every bucket
// pushed).
//
// Thread safety: BeginStep, hooks(), FinishStep, ParametersCopied and
// AwaitCopies from one thread at a time (the trainer's or the device's);
// the copies' done run on the device's runtime thread.
class DeviceOverlap {
 public:
  // The device's flat buffers and the host ones (from its AllocateHost) of
  // `num_parameters` floats; all outlive this object.
  DeviceOverlap(Device* device, float* device_gradients, float* device_parameters,
                float* host_gradients, const float* host_parameters, int64_t num_parameters);
  // Waits for the copies in flight, unless the device has failed (then their
  // done may never come).
  ~DeviceOverlap();
  DeviceOverlap(const DeviceOverlap&) = delete;
  DeviceOverlap& operator=(const DeviceOverlap&) = delete;

  // The device's parameters hold all of the host buffer's: the next step's
  // forward copies none.
  void ParametersCopied() { parameters_current_ = true; }

  // Starts a step whose copies are handed to `scheduler` (which outlives
  // them). Orders the step's work after the last step's copies. The error
  // of an earlier copy, or the device's.
  absl::Status BeginStep(PushPullScheduler* scheduler);
  // The device's hooks; valid while this object lives.
  model::ParameterHooks* hooks();
  // Once the pass has returned: copies what no hook covered, waits for the
  // device (reporting its errors) and for every copy's done.
  absl::Status FinishStep();
  // Blocks until the done of every copy issued has returned; the first
  // copy error. Call before the scheduler given to BeginStep goes away.
  absl::Status AwaitCopies();

 private:
  class Hooks;

  absl::Status CopyParameters(int64_t begin, int64_t end);
  // Gradients [offset, end) are final: copies what is not copied yet.
  void Report(int64_t offset);
  // A copy of [offset, ...) has landed (or failed).
  void Landed(int64_t offset, const absl::Status& status);
  absl::Status Error();

  Device* const device_;
  float* const device_gradients_;
  float* const device_parameters_;
  float* const host_gradients_;
  const float* const host_parameters_;
  const int64_t num_parameters_;
  std::unique_ptr<Hooks> hooks_;

  // The issuing thread's: the step's copies' lower bound, whether this
  // step's forward copies parameters, and whether the device failed.
  int64_t copied_from_ = 0;
  bool parameters_current_ = false;
  bool copy_parameters_ = true;
  bool device_failed_ = false;

  absl::Mutex mu_;
  PushPullScheduler* scheduler_ ABSL_GUARDED_BY(mu_) = nullptr;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;  // copies whose done has not returned
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps::worker

#endif  // PS_WORKER_DEVICE_OVERLAP_H_
