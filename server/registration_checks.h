#ifndef PS_SERVER_REGISTRATION_CHECKS_H_
#define PS_SERVER_REGISTRATION_CHECKS_H_

// What a registering worker must agree on with the job, and which rank it
// gets: ParameterServer::Register's checks, each of which leaves the job as
// it was when it refuses.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/optimizer/optimizer.h"
#include "common/param_spec.h"

namespace ps::server {

// The first difference between the job's signature and a worker's, in
// words ("parameter 'fc.bias' has shape [10] on the server but [11] on the
// worker"), or "" when they are equal.
std::string SignatureDifference(const std::vector<ParamSpec>& server,
                                const std::vector<ParamSpec>& worker);

// A registration's own fields against the job's size and model
// (`job_signature`: null before the first registration states it):
// kInvalidArgument for an empty worker id, a rank beyond `num_workers` or
// an empty first signature; kFailedPrecondition for a signature unlike the
// job's, naming the first difference.
absl::Status CheckRegistrant(const std::string& worker_id, int requested_rank, int num_workers,
                             const std::vector<ParamSpec>* job_signature,
                             const std::vector<ParamSpec>& signature);

// A worker's steps per epoch against the job's (`job_steps_per_epoch`, -1
// before the first registration): kInvalidArgument when negative,
// kFailedPrecondition when it differs from the job's or is 0 under a
// learning-rate schedule in epochs.
absl::Status CheckStepsPerEpoch(const std::string& worker_id, int64_t steps_per_epoch,
                                int64_t job_steps_per_epoch, const LrSchedule& schedule);

// The rank worker `worker_id` gets, given who holds each rank now
// (`holders[rank]`, "" for a free one): the rank it holds already (a
// restarted worker), else `requested_rank` when >= 0, else the lowest free
// one. kAlreadyExists when the worker holds another rank than it asks for,
// or the rank asked for is another worker's; kResourceExhausted when every
// rank is held. `requested_rank` < holders.size().
absl::StatusOr<int> ChooseRank(const std::vector<std::string>& holders,
                               const std::string& worker_id, int requested_rank);

// Under mutual TLS a worker's identity is its client certificate: whether
// the certificate's subject common names or subjectAltName entries (as
// gRPC's auth context gives them: "x509_common_name",
// "x509_subject_alternative_name") include `worker_id`. kPermissionDenied
// otherwise, naming the id and the certificate's names (at most 8, each
// cut to 64 bytes, so the refusal stays small).
absl::Status CheckCertificateNames(const std::string& worker_id,
                                   const std::vector<std::string>& common_names,
                                   const std::vector<std::string>& alt_names);

}  // namespace ps::server

#endif  // PS_SERVER_REGISTRATION_CHECKS_H_
