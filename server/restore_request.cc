#include "server/restore_request.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ps::server {

absl::StatusOr<bool> CheckRestoreRequest(const ParameterServer& server, absl::string_view session,
                                         const proto::RestoreRequest& request, bool can_restore) {
  PS_RETURN_IF_ERROR(server.CheckSession(request.rank(), session));
  const int64_t version = server.version();
  if (request.version() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("restore to version ", request.version(), "; versions start at 0"));
  }
  if (request.version() > version) {
    return absl::OutOfRangeError(absl::StrCat("restore to version ", request.version(),
                                              ", past this server's ", version,
                                              ": a restore only goes back"));
  }
  if (request.version() == version) return false;  // there already
  if (!can_restore) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no checkpoint of version ", request.version(), " to restore (this server is at ",
        version, " and keeps no checkpoints: no --checkpoint_dir)"));
  }
  return true;
}

}  // namespace ps::server
