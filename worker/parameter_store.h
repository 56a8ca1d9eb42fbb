#ifndef PS_WORKER_PARAMETER_STORE_H_
#define PS_WORKER_PARAMETER_STORE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/param_spec.h"

namespace ps::worker {

// Where the training loop sends gradients and gets parameters. The local
// implementation applies SGD in this process; the remote one talks gRPC to
// the parameter server. The loop is the same code either way.
//
// Protocol, per iteration t (starting at the version Register returns):
//   Push(t, samples, gradient sum of this worker)   -> returns once accepted
//   WaitForVersion(t + 1)                           -> all workers have pushed
//   Pull(t + 1, params)                             -> the new parameters
// Buffers are host memory, flat, in signature order; the caller owns them
// and may reuse them as soon as a call returns. Calls for one store come from
// one thread.
class ParameterStore {
 public:
  virtual ~ParameterStore() = default;

  struct Registration {
    int rank = 0;
    int num_workers = 1;
    int64_t version = 0;  // the version to pull first
  };

  // Registers this worker's model signature. `proposed` holds this worker's
  // own initial parameters; the store uses them only if it has none (a server
  // started from a weights file keeps its own). Pull(version) then returns
  // the parameters actually used.
  virtual absl::StatusOr<Registration> Register(const std::vector<ParamSpec>& signature,
                                                absl::Span<const float> proposed) = 0;

  // Sends this worker's gradient, summed over its `num_samples` samples, for
  // iteration `iteration`.
  virtual absl::Status Push(int64_t iteration, int64_t num_samples,
                            absl::Span<const float> gradient) = 0;

  // Blocks until version `version` is published (every worker's push for
  // iteration version - 1 has been applied). kDeadlineExceeded if it takes
  // longer than the store's deadline.
  virtual absl::Status WaitForVersion(int64_t version) = 0;

  // Copies version `version` (or a newer one) into `params`; returns the
  // version copied.
  virtual absl::StatusOr<int64_t> Pull(int64_t version, absl::Span<float> params) = 0;
};

}  // namespace ps::worker

#endif  // PS_WORKER_PARAMETER_STORE_H_
