#include "worker/data/dataset.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ps::worker::data {

int64_t Dataset::sample_elements() const {
  if (sample_shape.size() != 3) return 0;
  return sample_shape[0] * sample_shape[1] * sample_shape[2];
}

absl::Status ValidateDatasetLayout(const Dataset& dataset) {
  const std::string what = absl::StrCat("dataset '", dataset.name, "'");
  if (dataset.sample_shape.size() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": sample shape ", ShapeToString(dataset.sample_shape), " is not [C, H, W]"));
  }
  for (int64_t d : dataset.sample_shape) {
    // Each dimension bounded so that C * H * W cannot overflow.
    if (d < 1 || d > (int64_t{1} << 20)) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": sample shape ",
                                                     ShapeToString(dataset.sample_shape),
                                                     " has a dimension outside [1, 2^20]"));
    }
  }
  if (dataset.num_classes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": num_classes is ", dataset.num_classes, ", must be >= 1"));
  }
  const int64_t per_sample = dataset.sample_elements();
  // Divided rather than multiplied: no overflow for any sizes.
  const int64_t pixels = static_cast<int64_t>(dataset.pixels.size());
  if (pixels % per_sample != 0 || pixels / per_sample != dataset.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", dataset.pixels.size(), " pixel bytes for ", dataset.size(),
                     " samples of shape ", ShapeToString(dataset.sample_shape), " (expected ",
                     per_sample, " per sample)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateDataset(const Dataset& dataset) {
  PS_RETURN_IF_ERROR(ValidateDatasetLayout(dataset));
  for (int64_t i = 0; i < dataset.size(); ++i) {
    const int32_t label = dataset.labels[i];
    if (label < 0 || label >= dataset.num_classes) {
      return absl::InvalidArgumentError(absl::StrCat("dataset '", dataset.name, "': label ", label,
                                                     " of sample ", i, " is outside [0, ",
                                                     dataset.num_classes, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace ps::worker::data
