#ifndef PS_SERVER_INITIAL_VALUES_H_
#define PS_SERVER_INITIAL_VALUES_H_

// Where version 0 comes from: values given to the server (a checkpoint, or
// --init_weights: tensors matched by name to the workers' signature), or
// the chunks rank 0 sends (InitialChunks counts them in).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/param_spec.h"
#include "server/chunk_message.h"
#include "server/parameter_table.h"

namespace ps::server {

// One named tensor of initial values, matched to the workers' signature by
// name (a safetensors file's tensors have no order).
struct NamedTensor {
  std::string name;
  Shape shape;
  std::vector<float> values;  // row-major, NumElements(shape) of them
};

// kInvalidArgument for a tensor whose values do not fill its shape or hold
// a value that is not finite (naming the tensor and the element).
absl::Status CheckNamedTensors(const std::vector<NamedTensor>& tensors);

// Flat values in `signature` order, named by it. kInvalidArgument when
// `flat` has fewer or more elements than the signature needs.
absl::StatusOr<std::vector<NamedTensor>> NameFlatValues(const std::vector<ParamSpec>& signature,
                                                        const std::vector<float>& flat);

// The tensors laid out flat in `layout`'s signature order (tensors it does
// not name, such as batch-norm buffers, are ignored). kFailedPrecondition,
// naming the parameter, when one has no tensor or a tensor of another shape.
absl::StatusOr<std::vector<float>> LayOut(const std::vector<NamedTensor>& tensors,
                                          const ChunkLayout& layout);

// The initial chunks rank 0 sends, each once; version 0 exists once all
// are in. Not thread-safe (the server's bookkeeping lock guards it).
class InitialChunks {
 public:
  // Expects `total_chunks` chunks (0: none, the values were given).
  void Expect(int64_t total_chunks);
  // A restarted rank 0 sends everything again.
  void Restart();
  // Checks a message of initial chunks from worker `rank` before any is
  // received: kFailedPrecondition when every chunk is in already or `rank`
  // is not 0 (the one asked); per chunk as CheckChunkShapes (naming a chunk
  // received already) and CheckChunkValues. Returns their global indices.
  absl::StatusOr<std::vector<int64_t>> Check(int rank, const ChunkLayout& layout,
                                             absl::Span<const ChunkBytes> chunks) const;
  // Counts chunk `global_chunk` in (not received yet); returns whether
  // every chunk is in now.
  bool Receive(int64_t global_chunk);

 private:
  std::vector<bool> received_;
  int64_t count_ = 0;
  bool complete_ = false;
};

}  // namespace ps::server

#endif  // PS_SERVER_INITIAL_VALUES_H_
