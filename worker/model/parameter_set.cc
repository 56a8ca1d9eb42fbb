#include "worker/model/parameter_set.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/rng.h"
#include "common/status_macros.h"

namespace ps::worker::model {

absl::StatusOr<std::unique_ptr<ParameterSet>> ParameterSet::Create(Layer& root, Device* device) {
  std::unique_ptr<ParameterSet> set(new ParameterSet());
  root.Declare("", &set->decls_);
  int64_t num_parameters = 0, num_buffers = 0;
  for (const TensorSlot& slot : set->decls_.parameters) {
    set->parameter_specs_.push_back(slot.spec);
    num_parameters += NumElements(slot.spec.shape);
  }
  for (const TensorSlot& slot : set->decls_.buffers) {
    set->buffer_specs_.push_back(slot.spec);
    num_buffers += NumElements(slot.spec.shape);
  }
  PS_ASSIGN_OR_RETURN(set->flat_parameters_, Tensor::Empty(device, {num_parameters}));
  PS_ASSIGN_OR_RETURN(set->flat_gradients_, Tensor::Zeros(device, {num_parameters}));
  PS_ASSIGN_OR_RETURN(set->flat_buffers_, Tensor::Empty(device, {num_buffers}));

  int64_t offset = 0;
  for (TensorSlot& slot : set->decls_.parameters) {
    PS_ASSIGN_OR_RETURN(*slot.value, set->flat_parameters_.View(offset, slot.spec.shape));
    PS_ASSIGN_OR_RETURN(*slot.grad, set->flat_gradients_.View(offset, slot.spec.shape));
    if (!set->by_name_.emplace(slot.spec.name, *slot.value).second) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate tensor name ", slot.spec.name));
    }
    set->gradient_by_name_.emplace(slot.spec.name, *slot.grad);
    offset += NumElements(slot.spec.shape);
  }
  offset = 0;
  for (TensorSlot& slot : set->decls_.buffers) {
    PS_ASSIGN_OR_RETURN(*slot.value, set->flat_buffers_.View(offset, slot.spec.shape));
    if (!set->by_name_.emplace(slot.spec.name, *slot.value).second) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate tensor name ", slot.spec.name));
    }
    offset += NumElements(slot.spec.shape);
  }
  return set;
}

absl::StatusOr<Tensor> ParameterSet::Find(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) {
    return absl::NotFoundError(absl::StrCat("no parameter or buffer named ", name));
  }
  return it->second;
}

absl::StatusOr<Tensor> ParameterSet::FindGradient(const std::string& name) const {
  auto it = gradient_by_name_.find(name);
  if (it == gradient_by_name_.end()) {
    return absl::NotFoundError(absl::StrCat("no parameter named ", name));
  }
  return it->second;
}

namespace {

// Appends `slot`'s initial values to `out`.
void Fill(const TensorSlot& slot, SplitMix64& rng, std::vector<float>* out) {
  const int64_t n = NumElements(slot.spec.shape);
  switch (slot.init) {
    case InitKind::kZeros:
      out->insert(out->end(), n, 0.0f);
      return;
    case InitKind::kOnes:
      out->insert(out->end(), n, 1.0f);
      return;
    case InitKind::kXavierUniform: {
      const float bound =
          static_cast<float>(std::sqrt(6.0 / static_cast<double>(slot.fan_in + slot.fan_out)));
      for (int64_t i = 0; i < n; ++i) out->push_back((2.0f * rng.NextFloat() - 1.0f) * bound);
      return;
    }
  }
}

}  // namespace

absl::Status ParameterSet::Initialize(uint64_t seed) {
  SplitMix64 rng(seed);
  std::vector<float> values;
  values.reserve(flat_parameters_.num_elements());
  for (const TensorSlot& slot : decls_.parameters) Fill(slot, rng, &values);
  PS_RETURN_IF_ERROR(flat_parameters_.CopyFromHost(values));
  values.clear();
  for (const TensorSlot& slot : decls_.buffers) Fill(slot, rng, &values);
  return flat_buffers_.CopyFromHost(values);
}

}  // namespace ps::worker::model
