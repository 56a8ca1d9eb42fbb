#include "server/parameter_server_testing.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/param_spec.h"
#include "common/status_macros.h"

namespace ps::server {
namespace {

// One piece per chunk, over the chunk's floats. `pieces` must outlive the
// returned chunks.
std::vector<ChunkBytes> AsChunkBytes(absl::Span<const ChunkData> chunks,
                                     std::vector<absl::string_view>* pieces) {
  pieces->clear();
  for (const ChunkData& chunk : chunks) {
    pieces->emplace_back(reinterpret_cast<const char*>(chunk.data.data()),
                         chunk.data.size() * sizeof(float));
  }
  std::vector<ChunkBytes> out;
  for (size_t c = 0; c < chunks.size(); ++c) {
    out.push_back({chunks[c].key, chunks[c].chunk, absl::MakeConstSpan(&(*pieces)[c], 1)});
  }
  return out;
}

}  // namespace

absl::Status PushChunks(ParameterServer& server, int rank, int64_t iteration,
                        int64_t num_samples, absl::Span<const ChunkData> chunks) {
  std::vector<absl::string_view> pieces;
  return server.PushChunkBytes(rank, iteration, num_samples, AsChunkBytes(chunks, &pieces));
}

absl::Status Push(ParameterServer& server, int rank, int64_t iteration, int key, int64_t chunk,
                  int64_t num_samples, absl::Span<const float> gradient) {
  const ChunkData one{key, chunk, gradient};
  return PushChunks(server, rank, iteration, num_samples, absl::MakeConstSpan(&one, 1));
}

absl::Status InitializeChunks(ParameterServer& server, int rank,
                              absl::Span<const ChunkData> chunks) {
  std::vector<absl::string_view> pieces;
  return server.InitializeChunkBytes(rank, AsChunkBytes(chunks, &pieces));
}

absl::StatusOr<int64_t> PullChunks(ParameterServer& server, int64_t version, absl::Time deadline,
                                   absl::Span<const ChunkOut> chunks) {
  std::vector<ParameterServer::ChunkId> ids;
  for (const ChunkOut& chunk : chunks) ids.push_back({chunk.key, chunk.chunk});
  PS_ASSIGN_OR_RETURN(const ParameterServer::ChunkViews views,
                      server.PullChunkViews(version, deadline, ids));
  for (size_t c = 0; c < chunks.size(); ++c) {
    if (chunks[c].out.size() != views.chunks[c].size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk ", chunks[c].chunk, " of '", server.signature()[chunks[c].key].name, "' has ",
          views.chunks[c].size(), " elements, buffer ", chunks[c].out.size()));
    }
  }
  for (size_t c = 0; c < chunks.size(); ++c) {
    std::memcpy(chunks[c].out.data(), views.chunks[c].data(), views.chunks[c].size() * sizeof(float));
  }
  return views.version;
}

absl::StatusOr<int64_t> Pull(ParameterServer& server, int64_t version, absl::Time deadline,
                             absl::Span<float> out) {
  PS_ASSIGN_OR_RETURN(const int64_t pulled, server.WaitForVersion(version, deadline));
  if (static_cast<int64_t>(out.size()) != server.num_parameters()) {
    return absl::InvalidArgumentError(absl::StrCat("pull into ", out.size(),
                                                   " elements; the model has ",
                                                   server.num_parameters()));
  }
  const std::vector<ParamSpec> signature = server.signature();
  const int64_t chunk_elements = server.options().chunk_elements;
  std::vector<ParameterServer::ChunkId> ids;
  for (int key = 0; key < static_cast<int>(signature.size()); ++key) {
    const int64_t chunks = ChunkCount(NumElements(signature[key].shape), chunk_elements);
    for (int64_t c = 0; c < chunks; ++c) ids.push_back({key, c});
  }
  PS_ASSIGN_OR_RETURN(const ParameterServer::ChunkViews views,
                      server.PullChunkViews(pulled, deadline, ids));
  float* next = out.data();
  for (const absl::Span<const float> chunk : views.chunks) {
    std::memcpy(next, chunk.data(), chunk.size() * sizeof(float));
    next += chunk.size();
  }
  return pulled;
}

}  // namespace ps::server
