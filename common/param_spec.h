#ifndef PS_COMMON_PARAM_SPEC_H_
#define PS_COMMON_PARAM_SPEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/tensor.h"

namespace ps {

// One named tensor of a model: a trainable parameter or a buffer (batch-norm
// running statistics). Names and layouts are PyTorch's ("conv1.weight" OIHW,
// "fc1.weight" [out, in], "bn1.running_mean"), so that the parameter server's
// keys and the safetensors files match torch.nn models. A model's ordered list
// of trainable ParamSpecs is its signature: the server's keys, in key order.
struct ParamSpec {
  std::string name;
  Shape shape;
  DType dtype = DType::kF32;

  bool operator==(const ParamSpec& other) const {
    return name == other.name && shape == other.shape && dtype == other.dtype;
  }
  bool operator!=(const ParamSpec& other) const { return !(*this == other); }
};

// How many chunks of at most `chunk_elements` elements a tensor of `elements`
// elements travels in (proto/parameter_server.proto): at least one, so an
// empty tensor is still one (empty) chunk. chunk_elements >= 1.
inline int64_t ChunkCount(int64_t elements, int64_t chunk_elements) {
  const int64_t chunks = (elements + chunk_elements - 1) / chunk_elements;
  return chunks > 1 ? chunks : 1;
}

}  // namespace ps

#endif  // PS_COMMON_PARAM_SPEC_H_
