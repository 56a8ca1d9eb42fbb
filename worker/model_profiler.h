#ifndef PS_WORKER_MODEL_PROFILER_H_
#define PS_WORKER_MODEL_PROFILER_H_

// The worker's own models as model profiles (--write_model_profile): their
// per-layer forward and backward times measured in real passes and written
// in the format of deploy/experiments/model_profile.py, so the simulator,
// run.sh and other workers (--model=profile) can use a C++ model the way
// they use the PyTorch-measured ones.
//
// What is measured, on `clock`, in each timed pass (the format's
// definitions, model_profile.py's docstring):
//  - a layer's forward_ms: from its first BeforeForward (the first layer's:
//    from the pass's start) to the next layer's, the last layer's to the
//    start of the first backward event (so the loss is the last layer's);
//  - a layer's backward_ms: from the previous layer's last AfterBackward
//    (the last layer's: from that first backward event's start) to its own;
//  - each value is the median over the timed passes, and totals are the
//    medians of whole forward and backward halves.
// A layer is a top-level layer with parameters (LayerParameterBegins); its
// name is the first dot-separated part of its tensors' names ("fc1",
// "stage2"). On CUDA devices events time the host's enqueueing (Model's
// set_observer): the worker refuses to profile there.

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/tensor.h"
#include "worker/model/model.h"
#include "worker/model/model_profile.h"

namespace ps::worker {

struct ModelProfilerOptions {
  int64_t warmup_passes = 2;  // >= 0, untimed
  int64_t passes = 5;         // >= 1, timed
  // Copied into the profile: its model name and input description, and
  // measured.{where, date, cpu, cores, threads, software, note}
  // (measured.steps, warmup_steps and statistic are the ones above).
  std::string model_name;
  std::string input;
  model::ModelProfile::Measured measured;
};

// Times `options.passes` ForwardBackward passes of `model` on `inputs` and
// `labels` (inputs' first dimension is the profile's batch_size) after the
// warm-up ones, and returns the profile. Installs its own parameter hooks
// and observer on the model for the passes and resets both to null after
// (the model's step is set to -1). kInvalidArgument for bad pass counts or
// a model without parameters; the passes' errors.
absl::StatusOr<model::ModelProfile> MeasureModelProfile(model::Model& model, const Tensor& inputs,
                                                        const Tensor& labels, const Clock* clock,
                                                        const ModelProfilerOptions& options);

}  // namespace ps::worker

#endif  // PS_WORKER_MODEL_PROFILER_H_
