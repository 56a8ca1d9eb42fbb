#ifndef PS_SERVER_REGISTER_REQUEST_H_
#define PS_SERVER_REGISTER_REQUEST_H_

// A RegisterRequest as the domain sees it (ParameterServer::Register): the
// worker's signature and the rank it asks for, checked against bounds the
// wire must respect before anything is built from it.

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/param_spec.h"
#include "proto/parameter_server.pb.h"

namespace ps::server {

// Bounds on what a registration may name, so that no refusal quoting it
// outgrows gRPC's 8 KiB of status metadata (which broke the client's
// connection) and no request makes the server build a huge message.
inline constexpr size_t kMaxWorkerIdBytes = 256;
inline constexpr size_t kMaxTensorNameBytes = 1024;
inline constexpr size_t kMaxIdentityProofBytes = 1024;
inline constexpr int kMaxDimensions = 64;
inline constexpr size_t kMaxJobRunBytes = 64;

struct RegisterArgs {
  std::vector<ParamSpec> signature;
  int requested_rank = -1;  // -1: any free rank
  std::string job_run;      // proposed (RegisterRequest.job_run); may be empty
};

// kInvalidArgument, naming the problem, for a worker id, an identity proof,
// a job run or a tensor name over its bound, too many dimensions, a negative dimension, a dtype other
// than F32 or a negative requested rank. Element counts are left to
// ParameterServer::Register (which bounds them before allocating).
absl::StatusOr<RegisterArgs> ReadRegisterRequest(const proto::RegisterRequest& request);

}  // namespace ps::server

#endif  // PS_SERVER_REGISTER_REQUEST_H_
