#include "server/register_request.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace ps::server {

absl::StatusOr<RegisterArgs> ReadRegisterRequest(const proto::RegisterRequest& request) {
  if (request.worker_id().size() > kMaxWorkerIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a worker id of ", request.worker_id().size(),
                                                   " bytes; at most ", kMaxWorkerIdBytes));
  }
  if (request.identity_proof().size() > kMaxIdentityProofBytes) {
    return absl::InvalidArgumentError(absl::StrCat("an identity proof of ",
                                                   request.identity_proof().size(),
                                                   " bytes; at most ", kMaxIdentityProofBytes));
  }
  if (request.job_run().size() > kMaxJobRunBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a job run of ", request.job_run().size(),
                                                   " bytes; at most ", kMaxJobRunBytes));
  }
  RegisterArgs args;
  args.job_run = request.job_run();
  args.signature.reserve(request.signature_size());
  for (int i = 0; i < request.signature_size(); ++i) {
    const proto::TensorSpec& t = request.signature(i);
    if (t.name().size() > kMaxTensorNameBytes) {
      return absl::InvalidArgumentError(absl::StrCat("parameter ", i, "'s name has ",
                                                     t.name().size(), " bytes; at most ",
                                                     kMaxTensorNameBytes));
    }
    if (t.shape_size() > kMaxDimensions) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", t.name(), "' has ",
                                                     t.shape_size(), " dimensions; at most ",
                                                     kMaxDimensions));
    }
    if (t.dtype() != proto::DTYPE_F32) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter '", t.name(), "' has dtype ", t.dtype(),
                       "; only F32 parameters are supported"));
    }
    ParamSpec spec;
    spec.name = t.name();
    for (int64_t d : t.shape()) {
      if (d < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("parameter '", t.name(), "' has a negative dimension"));
      }
      spec.shape.push_back(d);
    }
    args.signature.push_back(std::move(spec));
  }
  if (request.has_requested_rank()) {
    if (request.requested_rank() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("requested rank ", request.requested_rank(), " is negative"));
    }
    args.requested_rank = request.requested_rank();
  }
  return args;
}

}  // namespace ps::server
