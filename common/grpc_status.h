#ifndef PS_COMMON_GRPC_STATUS_H_
#define PS_COMMON_GRPC_STATUS_H_

// absl::Status <-> grpc::Status. The two code enums are the same canonical
// codes with the same numbers, so the mapping is one-to-one.

#include <string>

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace ps {

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

// `what` (e.g. "Push to 127.0.0.1:5000") prefixes the message.
inline absl::Status FromGrpcStatus(const grpc::Status& status, const std::string& what) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      what + ": " + status.error_message());
}

}  // namespace ps

#endif  // PS_COMMON_GRPC_STATUS_H_
