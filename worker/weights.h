#ifndef PS_WORKER_WEIGHTS_H_
#define PS_WORKER_WEIGHTS_H_

#include <string>

#include "absl/status/status.h"
#include "worker/model/model.h"

namespace ps::worker {

// Saves `model`'s parameters and buffers as a safetensors file with PyTorch's
// names and layouts (a torch.nn model with the same state_dict keys loads it
// with load_state_dict). Batch-norm "num_batches_tracked" buffers are written
// as I64 scalars, as PyTorch keeps them. Atomic (see WriteSafetensors).
absl::Status SaveWeights(model::Model& model, const std::string& path);

// Loads every parameter and buffer of `model` from a safetensors file
// (F32 tensors; num_batches_tracked may be I64 or F32). The file must hold
// exactly the model's tensors: kInvalidArgument names the first missing,
// unexpected or wrongly shaped tensor, and the model is left unchanged then.
// File errors name the file.
absl::Status LoadWeights(const std::string& path, model::Model& model);

}  // namespace ps::worker

#endif  // PS_WORKER_WEIGHTS_H_
