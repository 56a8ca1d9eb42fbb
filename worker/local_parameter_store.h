#ifndef PS_WORKER_LOCAL_PARAMETER_STORE_H_
#define PS_WORKER_LOCAL_PARAMETER_STORE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/cpu_device.h"
#include "server/parameter_server.h"
#include "worker/parameter_store.h"

namespace ps::worker {

// The parameter store of single-process training: the server's own
// aggregation and optimizer code (server::ParameterServer) with one worker,
// called in process. Gradients and parameters still move through host
// buffers exactly as they would over the wire, so local and distributed
// training differ only in the transport.
class LocalParameterStore final : public ParameterStore {
 public:
  // `optimizer_threads` CPU threads run the SGD update. The schedule's
  // steps_per_epoch is the one this worker states at registration.
  static absl::StatusOr<std::unique_ptr<LocalParameterStore>> Create(
      const server::OptimizerOptions& optimizer, int optimizer_threads = 1);

  absl::StatusOr<Registration> Register(const std::vector<ParamSpec>& signature,
                                        absl::Span<const float> proposed) override;
  absl::Status Push(int64_t iteration, int64_t num_samples,
                    absl::Span<const float> gradient) override;
  absl::Status WaitForVersion(int64_t version) override;
  absl::StatusOr<int64_t> Pull(int64_t version, absl::Span<float> params) override;

  // One segment per tensor. Both calls do their work inside the call and run
  // `done` before returning; a pull of a segment whose version does not
  // exist yet fails at once (kDeadlineExceeded): with one worker it exists
  // as soon as its push returns.
  std::vector<int64_t> SegmentEnds() const override;
  void PushSegments(int64_t iteration, int64_t num_samples, int first, int last,
                    absl::Span<const float> gradient, Done done) override;
  void PullSegments(int64_t version, int first, int last, absl::Span<float> params,
                    Done done) override;

  server::ParameterServer& server() { return *server_; }

 private:
  LocalParameterStore() = default;

  // `flat` (signature order) as one chunk per key; kInvalidArgument when it
  // is shorter than the model.
  absl::StatusOr<std::vector<server::ParameterServer::ChunkData>> ChunkPerKey(
      absl::Span<const float> flat) const;
  // kInvalidArgument unless [first, last) is a range of keys and `flat`
  // holds the model.
  absl::Status CheckSegments(int first, int last, size_t flat_size) const;

  std::unique_ptr<CpuDevice> device_;
  std::unique_ptr<server::ParameterServer> server_;
  std::vector<ParamSpec> signature_;
  std::vector<int64_t> key_ends_;  // SegmentEnds(): each key's end, flat
  int rank_ = 0;
  int64_t steps_per_epoch_ = 0;
};

}  // namespace ps::worker

#endif  // PS_WORKER_LOCAL_PARAMETER_STORE_H_
