#include "server/registration_checks.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"

namespace ps::server {

std::string SignatureDifference(const std::vector<ParamSpec>& server,
                                const std::vector<ParamSpec>& worker) {
  const size_t n = std::min(server.size(), worker.size());
  for (size_t i = 0; i < n; ++i) {
    const ParamSpec& s = server[i];
    const ParamSpec& w = worker[i];
    if (s.name != w.name) {
      return absl::StrCat("parameter ", i, " is '", s.name, "' on the server but '", w.name,
                          "' on the worker");
    }
    if (s.shape != w.shape) {
      return absl::StrCat("parameter '", s.name, "' has shape ", ShapeToString(s.shape),
                          " on the server but ", ShapeToString(w.shape), " on the worker");
    }
    if (s.dtype != w.dtype) {
      return absl::StrCat("parameter '", s.name, "' has dtype ", DTypeName(s.dtype),
                          " on the server but ", DTypeName(w.dtype), " on the worker");
    }
  }
  if (server.size() != worker.size()) {
    return absl::StrCat("the server's model has ", server.size(), " parameters, the worker's ",
                        worker.size());
  }
  return "";
}

absl::Status CheckRegistrant(const std::string& worker_id, int requested_rank, int num_workers,
                             const std::vector<ParamSpec>* job_signature,
                             const std::vector<ParamSpec>& signature) {
  if (worker_id.empty()) return absl::InvalidArgumentError("worker id is empty");
  if (requested_rank >= num_workers) {
    return absl::InvalidArgumentError(absl::StrCat("worker '", worker_id, "' asks for rank ",
                                                   requested_rank, " but the job has ",
                                                   num_workers, " workers"));
  }
  if (job_signature == nullptr) {
    if (signature.empty()) return absl::InvalidArgumentError("worker sent an empty signature");
    return absl::OkStatus();
  }
  const std::string diff = SignatureDifference(*job_signature, signature);
  if (diff.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("worker '", worker_id, "' has a different model: ", diff));
}

absl::Status CheckStepsPerEpoch(const std::string& worker_id, int64_t steps_per_epoch,
                                int64_t job_steps_per_epoch, const LrSchedule& schedule) {
  if (steps_per_epoch < 0) {
    return absl::InvalidArgumentError(absl::StrCat("worker '", worker_id, "' states ",
                                                   steps_per_epoch, " steps per epoch"));
  }
  if (job_steps_per_epoch >= 0 && steps_per_epoch != job_steps_per_epoch) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker '", worker_id, "' has ", steps_per_epoch, " steps per epoch but the job has ",
        job_steps_per_epoch, " (do the workers' datasets and --batch_size agree?)"));
  }
  if (schedule.unit == LrSchedule::Unit::kEpochs && schedule.step_size > 0 &&
      steps_per_epoch < 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the learning rate decays every ", schedule.step_size, " epochs, but worker '", worker_id,
        "' states no steps per epoch"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> ChooseRank(const std::vector<std::string>& holders,
                               const std::string& worker_id, int requested_rank) {
  const int ranks = static_cast<int>(holders.size());
  int rank = -1;
  for (int r = 0; r < ranks; ++r) {
    if (holders[r] == worker_id) rank = r;
  }
  if (requested_rank >= 0 && rank != requested_rank) {
    if (rank >= 0) {
      return absl::AlreadyExistsError(absl::StrCat("worker '", worker_id, "' holds rank ", rank,
                                                   " and cannot move to rank ", requested_rank));
    }
    if (!holders[requested_rank].empty()) {
      return absl::AlreadyExistsError(absl::StrCat("rank ", requested_rank,
                                                   " is already held by worker '",
                                                   holders[requested_rank], "'"));
    }
    rank = requested_rank;
  }
  for (int r = 0; rank < 0 && r < ranks; ++r) {
    if (holders[r].empty()) rank = r;
  }
  if (rank < 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "worker '", worker_id, "' refused: all ", ranks, " worker slots are registered"));
  }
  return rank;
}

absl::Status CheckCertificateNames(const std::string& worker_id,
                                   const std::vector<std::string>& common_names,
                                   const std::vector<std::string>& alt_names) {
  constexpr size_t kNamesQuoted = 8;
  constexpr size_t kNameBytesQuoted = 64;
  std::vector<std::string> quoted;
  auto quote = [&](const std::vector<std::string>& names, absl::string_view kind) {
    for (const std::string& name : names) {
      if (quoted.size() == kNamesQuoted) return;
      quoted.push_back(absl::StrCat(kind, " '", name.substr(0, kNameBytesQuoted),
                                    name.size() > kNameBytesQuoted ? "..." : "", "'"));
    }
  };
  for (const std::vector<std::string>* names : {&common_names, &alt_names}) {
    for (const std::string& name : *names) {
      if (name == worker_id) return absl::OkStatus();
    }
  }
  quote(common_names, "CN");
  quote(alt_names, "SAN");
  const size_t total = common_names.size() + alt_names.size();
  return absl::PermissionDeniedError(absl::StrCat(
      "worker '", worker_id.substr(0, kNameBytesQuoted),
      "' must present a client certificate whose CN or subjectAltName is its id; this one names ",
      quoted.empty() ? "nothing" : absl::StrJoin(quoted, ", "),
      total > quoted.size() ? absl::StrCat(" and ", total - quoted.size(), " more") : ""));
}

}  // namespace ps::server
