#ifndef PS_WORKER_MODEL_PARAMETER_SET_H_
#define PS_WORKER_MODEL_PARAMETER_SET_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/device.h"
#include "common/param_spec.h"
#include "common/tensor.h"
#include "worker/model/layer.h"

namespace ps::worker::model {

// The flat parameter, gradient and buffer storage of one layer tree, bound to
// the layers' tensors. The layer tree must outlive the set and must not be
// bound to another set.
class ParameterSet {
 public:
  // Collects `root`'s declarations (names prefixed by nothing), allocates the
  // three flat buffers on `device` and binds every declared tensor to its
  // view. Gradients start at zero; parameters and buffers are uninitialised
  // until Initialize. kInvalidArgument for a duplicate name.
  static absl::StatusOr<std::unique_ptr<ParameterSet>> Create(Layer& root, Device* device);

  const std::vector<ParamSpec>& parameters() const { return parameter_specs_; }
  const std::vector<ParamSpec>& buffers() const { return buffer_specs_; }
  Tensor& flat_parameters() { return flat_parameters_; }
  Tensor& flat_gradients() { return flat_gradients_; }
  Tensor& flat_buffers() { return flat_buffers_; }
  // A parameter's or buffer's view; kNotFound naming it otherwise.
  absl::StatusOr<Tensor> Find(const std::string& name) const;
  // The gradient view of a parameter; kNotFound otherwise.
  absl::StatusOr<Tensor> FindGradient(const std::string& name) const;

  // Fills parameters and buffers as their declarations say, from a
  // SplitMix64 stream (common/rng.h) seeded by `seed` and consumed in
  // parameter order. The values are generated on the host, so they are
  // bit-identical on every device type; one host-to-device copy per flat
  // buffer.
  absl::Status Initialize(uint64_t seed);

 private:
  ParameterSet() = default;

  TensorDecls decls_;
  std::vector<ParamSpec> parameter_specs_, buffer_specs_;
  Tensor flat_parameters_, flat_gradients_, flat_buffers_;
  absl::flat_hash_map<std::string, Tensor> by_name_, gradient_by_name_;
};

}  // namespace ps::worker::model

#endif  // PS_WORKER_MODEL_PARAMETER_SET_H_
