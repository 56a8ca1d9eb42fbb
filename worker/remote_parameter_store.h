#ifndef PS_WORKER_REMOTE_PARAMETER_STORE_H_
#define PS_WORKER_REMOTE_PARAMETER_STORE_H_

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/parameter_server.grpc.pb.h"
#include "worker/parameter_store.h"

namespace ps::worker {

struct RemoteStoreOptions {
  std::string server_address = "127.0.0.1:50051";  // host:port
  std::string worker_id;  // stable per worker; default: hostname-pid
  int rank = -1;          // the rank to ask for; -1: any free one
  // How long Register waits for the server to come up.
  absl::Duration connect_timeout = absl::Seconds(60);
  // Deadline of each Push and Pull chunk call.
  absl::Duration rpc_timeout = absl::Seconds(60);
  // How long WaitForVersion waits for the slowest worker.
  absl::Duration wait_timeout = absl::Seconds(600);
};

// The parameter store on the other side of a gRPC channel. Push and Pull cut
// the flat buffer into the server's chunks, pack small chunks together into
// messages of at most one chunk's size, and send all messages concurrently
// (gRPC callback API), waiting for every reply; the first error is returned
// naming the message's first key and chunk. The server owns the initial parameters
// (from its seed or weights file), so Register ignores `proposed`.
class RemoteParameterStore final : public ParameterStore {
 public:
  static absl::StatusOr<std::unique_ptr<RemoteParameterStore>> Create(
      const RemoteStoreOptions& options);

  absl::StatusOr<Registration> Register(const std::vector<ParamSpec>& signature,
                                        absl::Span<const float> proposed) override;
  absl::Status Push(int64_t iteration, int64_t num_samples,
                    absl::Span<const float> gradient) override;
  absl::Status WaitForVersion(int64_t version) override;
  absl::StatusOr<int64_t> Pull(int64_t version, absl::Span<float> params) override;

  // Bytes of tensor data sent and received so far (payload, not framing).
  int64_t bytes_pushed() const { return bytes_pushed_; }
  int64_t bytes_pulled() const { return bytes_pulled_; }

 private:
  explicit RemoteParameterStore(const RemoteStoreOptions& options);

  // A chunk of the flat buffer: key, index within the key, element range.
  struct Chunk {
    int key;
    int64_t index;
    int64_t offset;  // into the flat buffer
    int64_t length;
  };

  const RemoteStoreOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<proto::ParameterServer::Stub> stub_;
  std::vector<Chunk> chunks_;
  // Chunks grouped into messages of at most chunk_elements elements: many
  // small tensors share a message, a large one has one message per chunk.
  std::vector<std::vector<Chunk>> messages_;
  int64_t num_parameters_ = 0;
  int rank_ = -1;
  int64_t bytes_pushed_ = 0;
  int64_t bytes_pulled_ = 0;
};

}  // namespace ps::worker

#endif  // PS_WORKER_REMOTE_PARAMETER_STORE_H_
