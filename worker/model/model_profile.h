#ifndef PS_WORKER_MODEL_MODEL_PROFILE_H_
#define PS_WORKER_MODEL_MODEL_PROFILE_H_

// Model profiles in C++: a model's parameter tensors and per-layer compute
// time, in the JSON format of deploy/experiments/model_profile.py (its
// docstring and deploy/experiments/README.md, "Model profiles", define it).
// The worker replays one (profile_model.h, --model=profile) and writes one of
// its own models (--write_model_profile). This reader refuses exactly what
// model_profile.py's validate refuses, naming the field the same way
// ("layers[3].forward_ms: -1 is negative"), so a profile one accepts the
// other accepts too.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tensor.h"

namespace ps::worker::model {

struct ModelProfile {
  struct Measured {
    std::string where, date, cpu, statistic = "median", note;  // note: "" when absent
    int64_t cores = 1, threads = 1, steps = 1, warmup_steps = 0;
    std::map<std::string, std::string> software;  // name -> version, at least one
  };
  struct TensorEntry {
    std::string name;
    Shape shape;                    // every size >= 1; [] is a scalar
    std::string dtype = "float32";  // model_profile.py's DTYPE_BYTES names
  };
  struct Layer {
    std::string name;
    std::vector<std::string> tensors;        // names in `tensors`, at least one
    double forward_ms = 0, backward_ms = 0;  // per pass of batch_size samples
  };

  std::string model;
  int64_t batch_size = 1;  // samples of one measured pass
  std::string input;       // optional ("" when absent)
  Measured measured;
  std::vector<TensorEntry> tensors;  // the model's parameter order
  std::vector<Layer> layers;         // forward order; each tensor in exactly one
  // Optional whole-pass medians; negative when absent.
  double total_forward_ms = -1, total_backward_ms = -1;
};

// Bounds shared with model_profile.py: no tensor above 1 TiB, no model above
// 16 TiB, no time above a day.
inline constexpr int64_t kMaxProfileTensorBytes = int64_t{1} << 40;
inline constexpr int64_t kMaxProfileModelBytes = int64_t{1} << 44;
inline constexpr double kMaxProfileMs = 86'400'000.0;

// Bytes per element of a profile dtype name; 0 for an unknown one.
int64_t ProfileDTypeBytes(const std::string& dtype);

// The profile in `json`; kInvalidArgument "FIELD: why" for the first thing
// model_profile.py would refuse (not JSON, a missing or unknown field, a
// wrong type, a negative or non-finite time, a size below 1 or an element
// count that overflows int64, bytes over the bounds, an unknown dtype, a
// repeated name, a tensor in no layer or in two, a layer naming a tensor
// that does not exist).
absl::StatusOr<ModelProfile> ParseModelProfile(const std::string& json);

// ParseModelProfile of the file at `path`, errors prefixed by the path;
// kNotFound when it cannot be read.
absl::StatusOr<ModelProfile> ReadModelProfile(const std::string& path);

// The profile as JSON (the format's field order, indented), which
// ParseModelProfile and model_profile.py accept when `profile` is valid.
std::string ModelProfileToJson(const ModelProfile& profile);

// Writes ModelProfileToJson to `path`; kUnavailable naming it on failure.
absl::Status WriteModelProfile(const ModelProfile& profile, const std::string& path);

}  // namespace ps::worker::model

#endif  // PS_WORKER_MODEL_MODEL_PROFILE_H_
