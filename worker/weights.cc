#include "worker/weights.h"

#include <set>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/safetensors.h"
#include "common/status_macros.h"

namespace ps::worker {
namespace {

bool IsCounter(const std::string& name) { return absl::EndsWith(name, "num_batches_tracked"); }

}  // namespace

absl::Status SaveWeights(model::Model& model, const std::string& path) {
  std::vector<NamedHostTensor> tensors;
  for (const std::vector<ParamSpec>* specs : {&model.parameters(), &model.buffers()}) {
    for (const ParamSpec& spec : *specs) {
      PS_ASSIGN_OR_RETURN(Tensor t, model.Find(spec.name));
      PS_ASSIGN_OR_RETURN(std::vector<float> values, t.ToVector());
      if (IsCounter(spec.name)) {
        std::vector<int64_t> counts(values.begin(), values.end());
        PS_ASSIGN_OR_RETURN(NamedHostTensor nt,
                            NamedHostTensor::FromInt64s(spec.name, spec.shape, counts));
        tensors.push_back(std::move(nt));
      } else {
        PS_ASSIGN_OR_RETURN(NamedHostTensor nt,
                            NamedHostTensor::FromFloats(spec.name, spec.shape, values));
        tensors.push_back(std::move(nt));
      }
    }
  }
  return WriteSafetensors(path, tensors,
                          {{"format", "pt"}, {"model", model.config().name}});
}

absl::Status LoadWeights(const std::string& path, model::Model& model) {
  PS_ASSIGN_OR_RETURN(SafetensorsFile file, ReadSafetensors(path));
  // Check and convert everything first, so a bad file changes nothing.
  std::vector<std::pair<Tensor, std::vector<float>>> updates;
  std::set<std::string> expected;
  for (const std::vector<ParamSpec>* specs : {&model.parameters(), &model.buffers()}) {
    for (const ParamSpec& spec : *specs) {
      expected.insert(spec.name);
      auto found = file.Find(spec.name);
      if (!found.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": no tensor '", spec.name,
                                                       "', which model '", model.config().name,
                                                       "' needs"));
      }
      const NamedHostTensor& nt = **found;
      // PyTorch stores num_batches_tracked as a scalar ([]); ours is [1].
      const bool shape_ok = nt.shape == spec.shape ||
                            (IsCounter(spec.name) && nt.num_elements() == 1);
      if (!shape_ok) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ": tensor '", spec.name, "' has shape ", ShapeToString(nt.shape),
            " but model '", model.config().name, "' needs ", ShapeToString(spec.shape)));
      }
      if (!IsCounter(spec.name) && nt.dtype != SafetensorsDType::kF32) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", spec.name, "' is ",
                                                       SafetensorsDTypeName(nt.dtype),
                                                       "; F32 is needed"));
      }
      PS_ASSIGN_OR_RETURN(std::vector<float> values, nt.ToFloats());
      PS_ASSIGN_OR_RETURN(Tensor t, model.Find(spec.name));
      updates.emplace_back(std::move(t), std::move(values));
    }
  }
  for (const NamedHostTensor& nt : file.tensors) {
    if (expected.count(nt.name) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": unexpected tensor '", nt.name,
                                                     "' for model '", model.config().name, "'"));
    }
  }
  for (auto& [tensor, values] : updates) PS_RETURN_IF_ERROR(tensor.CopyFromHost(values));
  return absl::OkStatus();
}

}  // namespace ps::worker
