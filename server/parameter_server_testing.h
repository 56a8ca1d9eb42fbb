#ifndef PS_SERVER_PARAMETER_SERVER_TESTING_H_
#define PS_SERVER_PARAMETER_SERVER_TESTING_H_

// Conveniences for tests and benchmarks that drive a ParameterServer: pushes and
// initial values from float spans (the server takes received bytes,
// ChunkBytes), and pulls that copy (the server hands out views). Each has
// the checks, errors and events of the server call it wraps.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "server/parameter_server.h"

namespace ps::server {

struct ChunkData {
  int key = 0;
  int64_t chunk = 0;
  absl::Span<const float> data;
};
// ParameterServer::PushChunkBytes, one piece per chunk.
absl::Status PushChunks(ParameterServer& server, int rank, int64_t iteration,
                        int64_t num_samples, absl::Span<const ChunkData> chunks);
// One chunk.
absl::Status Push(ParameterServer& server, int rank, int64_t iteration, int key, int64_t chunk,
                  int64_t num_samples, absl::Span<const float> gradient);
// ParameterServer::InitializeChunkBytes, one piece per chunk.
absl::Status InitializeChunks(ParameterServer& server, int rank,
                              absl::Span<const ChunkData> chunks);

// PullChunkViews, each chunk copied into its `out`, which must be exactly
// the chunk's length (kInvalidArgument otherwise, after the wait; then
// nothing is copied). Returns the views' version.
struct ChunkOut {
  int key = 0;
  int64_t chunk = 0;
  absl::Span<float> out;
};
absl::StatusOr<int64_t> PullChunks(ParameterServer& server, int64_t version, absl::Time deadline,
                                   absl::Span<const ChunkOut> chunks);
// Waits like WaitForVersion and copies all parameters into `out` (flat in
// signature order, exactly num_parameters() elements: kInvalidArgument
// otherwise). Returns the server's version; every chunk copied is at least
// that version.
absl::StatusOr<int64_t> Pull(ParameterServer& server, int64_t version, absl::Time deadline,
                             absl::Span<float> out);

}  // namespace ps::server

#endif  // PS_SERVER_PARAMETER_SERVER_TESTING_H_
