#ifndef PS_SERVER_RESTORE_REQUEST_H_
#define PS_SERVER_RESTORE_REQUEST_H_

// A Restore call's checks (proto/parameter_server.proto, Restore): who may
// ask a server to go back to its checkpoint of a version, and when there is
// anything for the server's owner to decide.

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/parameter_server.pb.h"
#include "server/parameter_server.h"

namespace ps::server {

// In the proto's order: `session` must be `request.rank()`'s (as
// ParameterServer::CheckSession); kInvalidArgument for a version below 0,
// kOutOfRange for one past the server's. Then false when the server is at
// the version already (nothing to do), true when its owner must decide
// (`can_restore`: the server keeps checkpoints), kFailedPrecondition naming
// the versions when it keeps none.
absl::StatusOr<bool> CheckRestoreRequest(const ParameterServer& server, absl::string_view session,
                                         const proto::RestoreRequest& request, bool can_restore);

}  // namespace ps::server

#endif  // PS_SERVER_RESTORE_REQUEST_H_
