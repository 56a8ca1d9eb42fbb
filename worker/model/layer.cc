#include "worker/model/layer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ps::worker::model {

absl::StatusOr<Tensor> ActivationBuffer::Get(Device* device, const Shape& shape, DType dtype) {
  const int64_t n = NumElements(shape);
  if (storage_.empty() || storage_.device() != device || storage_.dtype() != dtype ||
      storage_.num_elements() < n) {
    PS_ASSIGN_OR_RETURN(storage_, Tensor::Empty(device, {n}, dtype));
  }
  return storage_.View(0, shape);
}

namespace internal {

absl::Status BadInput(const std::string& layer, const Shape& input, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat(layer, " cannot take input ", ShapeToString(input), ": ", why));
}

absl::Status NoForward(const std::string& layer) {
  return absl::FailedPreconditionError(absl::StrCat(layer, ": Backward without Forward"));
}

absl::Status CheckGradShape(const std::string& layer, const Tensor& dy, const Shape& expected) {
  if (dy.shape() != expected) {
    return absl::InvalidArgumentError(absl::StrCat(layer, ": gradient of shape ",
                                                   ShapeToString(dy.shape()), ", expected ",
                                                   ShapeToString(expected)));
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> BeginBackward(const std::string& layer, const Tensor& x, const Tensor& dy,
                                     const Shape& dy_shape, bool need_dx, ActivationBuffer& dx,
                                     Device* device) {
  if (x.empty()) return NoForward(layer);
  PS_RETURN_IF_ERROR(CheckGradShape(layer, dy, dy_shape));
  if (!need_dx) return Tensor();
  return dx.Get(device, x.shape());
}

absl::Status CheckDevice(const std::string& layer, const Tensor& x, Device* device) {
  if (x.device() != device) {
    return absl::InvalidArgumentError(absl::StrCat(layer, ": tensor on ",
                                                   x.device() ? x.device()->name() : "no device",
                                                   ", layer on ", device->name()));
  }
  if (x.dtype() != DType::kF32) {
    return absl::InvalidArgumentError(
        absl::StrCat(layer, ": activations must be F32, got ", DTypeName(x.dtype())));
  }
  return absl::OkStatus();
}

void AddParameter(TensorDecls* decls, std::string name, Shape shape, InitKind init, int64_t fan_in,
                  int64_t fan_out, Tensor* value, Tensor* grad) {
  TensorSlot slot;
  slot.spec = ParamSpec{std::move(name), std::move(shape), DType::kF32};
  slot.init = init;
  slot.fan_in = fan_in;
  slot.fan_out = fan_out;
  slot.value = value;
  slot.grad = grad;
  decls->parameters.push_back(std::move(slot));
}

void AddBuffer(TensorDecls* decls, std::string name, Shape shape, InitKind init, Tensor* value) {
  TensorSlot slot;
  slot.spec = ParamSpec{std::move(name), std::move(shape), DType::kF32};
  slot.init = init;
  slot.value = value;
  decls->buffers.push_back(std::move(slot));
}

}  // namespace internal
}  // namespace ps::worker::model
