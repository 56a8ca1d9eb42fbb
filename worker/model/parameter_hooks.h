#ifndef PS_WORKER_MODEL_PARAMETER_HOOKS_H_
#define PS_WORKER_MODEL_PARAMETER_HOOKS_H_

#include <cstdint>

#include "absl/status/status.h"

namespace ps::worker::model {

// What lets communication overlap a replica's compute (the trainer's
// pipeline): ForwardBackward calls these around each top-level layer that
// has parameters, on the thread driving the replica, with the layer's
// half-open element range [begin, end) of flat_parameters() and
// flat_gradients(). Ranges come in layer order in the forward pass and in
// reverse in the backward pass. A layer that works in parts
// (Layer::AwaitsParametersInParts: a large Linear) calls BeforeForward once
// per part, its parts' ranges descending (the order in which its backward
// hands them over, and so the order in which they arrive), and
// GradientsReady once per part with `begin` descending and `end` its own end.
class ParameterHooks {
 public:
  virtual ~ParameterHooks() = default;

  // Before the layer's forward pass: may block until elements [begin, end)
  // of the parameters are the ones this pass must use. An error aborts the
  // pass and is ForwardBackward's result.
  virtual absl::Status BeforeForward(int64_t begin, int64_t end) = 0;

  // Inside the layer's backward pass, for layers that say so (Linear):
  // gradient elements [begin, end) are final, but the layer still reads its
  // parameters (it computes the rest, and its input gradient, next).
  // AfterBackward follows.
  virtual void GradientsReady(int64_t begin, int64_t end) {}

  // After the layer's backward pass: gradient elements [begin, end) are
  // final for this pass (on CUDA devices: enqueued, not necessarily
  // computed), and the layer will not read its parameters again in it.
  virtual void AfterBackward(int64_t begin, int64_t end) = 0;
};

}  // namespace ps::worker::model

#endif  // PS_WORKER_MODEL_PARAMETER_HOOKS_H_
