#include "server/call_admission.h"

#include "absl/strings/str_cat.h"
#include "common/job_token.h"

namespace ps::server {

absl::Status CallAdmission::Admit(absl::string_view token) const {
  if (stopping_) {
    absl::MutexLock lock(&mu_);
    if (!failure_.ok()) return failure_;
    return absl::UnavailableError(absl::StrCat("server shutting down: ", stop_reason_));
  }
  if (job_token_.empty()) return absl::OkStatus();
  if (token.empty()) {
    return absl::UnauthenticatedError(
        absl::StrCat("this server needs the job token (metadata ", kJobTokenMetadataKey,
                     "; --job_token_file or $", kJobTokenEnvVar, " on the client)"));
  }
  if (!TokensEqual(token, job_token_)) return absl::UnauthenticatedError("wrong job token");
  return absl::OkStatus();
}

void CallAdmission::Stop(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  if (stop_reason_.empty()) stop_reason_ = reason.empty() ? "stopped" : reason;
  stopping_ = true;
}

bool CallAdmission::Fail(const absl::Status& failure) {
  absl::MutexLock lock(&mu_);
  if (!failure_.ok()) return false;
  failure_ = failure;
  stopping_ = true;
  return true;
}

}  // namespace ps::server
