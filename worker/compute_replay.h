#ifndef PS_WORKER_COMPUTE_REPLAY_H_
#define PS_WORKER_COMPUTE_REPLAY_H_

// Compute that fits on one machine: a worker that replays its model's
// measured forward/backward time instead of computing, so eight or sixteen
// emulated hosts on two cores still push and pull real gradients of the
// model's real size and layout, layer by layer, through the real pipeline.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "common/clock.h"
#include "worker/model/parameter_hooks.h"

namespace ps::worker {

// One ForwardBackward as a script: what the pass did at each layer that has
// parameters, with the time between those points.
struct ComputeProfile {
  struct Point {
    enum Kind {
      kNeedParameters,  // a layer's forward is about to read [begin, end)
      kGradientsEarly,  // inside a layer's backward, [begin, end) is final
                        // but the layer still reads its parameters
      kGradientsReady,  // a layer's backward has made [begin, end) final
      kEnd,             // the pass has returned
    };
    Kind kind = kEnd;
    int64_t begin = 0, end = 0;
    // Time from the previous point (or the pass's start) to this one,
    // averaged over the passes measured.
    int64_t gap_ns = 0;
  };
  std::vector<Point> points;
  int64_t passes = 0;  // measured

  // The whole pass: the sum of the gaps.
  int64_t step_ns() const;
};

// Hooks that time one ForwardBackward (they never block): install them on
// the replica, run the pass, then call EndPass. Several passes average into
// one profile; every pass must reach the same points (the same model), else
// kFailedPrecondition.
class ProfilingHooks final : public model::ParameterHooks {
 public:
  explicit ProfilingHooks(const Clock* clock) : clock_(clock) {}

  void BeginPass();
  absl::Status BeforeForward(int64_t begin, int64_t end) override;
  void GradientsReady(int64_t begin, int64_t end) override;
  void AfterBackward(int64_t begin, int64_t end) override;
  absl::Status EndPass();

  // The average of the passes so far.
  ComputeProfile profile() const;

 private:
  void Mark(ComputeProfile::Point::Kind kind, int64_t begin, int64_t end);

  const Clock* const clock_;
  int64_t last_ns_ = 0;
  std::vector<ComputeProfile::Point> current_;  // this pass, gaps in ns
  std::vector<ComputeProfile::Point> sum_;      // all passes, gaps summed
  int64_t passes_ = 0;
  absl::Status error_;
};

}  // namespace ps::worker

#endif  // PS_WORKER_COMPUTE_REPLAY_H_
