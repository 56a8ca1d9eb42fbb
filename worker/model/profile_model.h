#ifndef PS_WORKER_MODEL_PROFILE_MODEL_H_
#define PS_WORKER_MODEL_PROFILE_MODEL_H_

// A model from outside: a model profile (model_profile.h) replayed as a
// Model, so a worker trains ResNet-50, VGG-16 or BERT as measured in
// PyTorch (deploy/experiments/profiles/) without computing them. Its
// parameters are exactly the profile's tensors (names, shapes, in the
// profile's order: the server registers them so), in one flat F32 buffer
// like every model's; ForwardBackward sleeps through each layer's measured
// time and calls the ParameterHooks a real pass calls at the same points,
// so the pipeline pushes and pulls the model's real bytes, layer by layer,
// overlapped as the measured model would overlap them.
//
// The rules (docs/experiments.md, "Models from outside in the worker"):
//  - Time: a layer's forward_ms and backward_ms are per pass of the
//    profile's batch_size samples; a pass of n samples takes them times
//    n / batch_size (compute linear in the batch, which a profile measured
//    at one batch cannot refine).
//  - Forward: for each layer in the profile's order, BeforeForward(the
//    layer's range), then its forward_ms from when the parameters were
//    there (a wait for them delays the rest, as it would a real pass).
//  - Backward: for each layer in reverse, its backward_ms, then its
//    gradients, then AfterBackward(its range). The sleeps run to deadlines
//    on the clock, so writing the gradients takes none of the layer's time.
//  - Gradients: element i of the flat gradient is
//    n * loss_scale * 1e-3 * ((i mod 7) - 3): deterministic, finite, the
//    gradient of a loss sum over n samples (the trainer divides by the
//    batch), never all zero. Parameters initialise to 0 (a profile carries
//    no values); the loss and accuracy read 0; Evaluate takes no time.
//  - Refused (kInvalidArgument naming the tensor or layer): a dtype other
//    than float32 (the wire is F32; a worker casting fp16 or int tensors
//    would push bytes the measured model does not), and a layer whose
//    tensors are not consecutive in the tensors' order, or layers not in
//    ascending order (the hooks take one ascending range per layer). Every
//    committed profile meets both.
//  - Devices with host memory only (CPU): kUnimplemented otherwise, since
//    the gradients are written by the host.
//
// Thread contract as Model's: one thread drives a replica.

#include <memory>

#include "absl/status/statusor.h"
#include "common/device.h"
#include "worker/model/model.h"

namespace ps::worker::model {

// The replay of config.profile (non-null) on `device`, sleeping on
// config.profile_clock (Clock::Real() when null). Model::Create calls this
// for config.name "profile".
absl::StatusOr<std::unique_ptr<Model>> CreateProfileModel(const ModelConfig& config,
                                                          Device* device);

}  // namespace ps::worker::model

#endif  // PS_WORKER_MODEL_PROFILE_MODEL_H_
