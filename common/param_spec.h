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

}  // namespace ps

#endif  // PS_COMMON_PARAM_SPEC_H_
