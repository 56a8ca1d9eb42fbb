#include "server/serving_control.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace ps::server {

void ServingControl::Stop(std::string reason) {
  std::vector<Pending> answered;
  std::string said;
  {
    absl::MutexLock lock(&mu_);
    if (!stop_.has_value()) stop_ = std::move(reason);
    said = *stop_;
    answered.swap(pending_);
  }
  for (Pending& p : answered) {
    p.done(absl::UnavailableError(absl::StrCat("server shutting down: ", said)));
  }
}

void ServingControl::AskRestore(int64_t version, Done done) {
  std::string stopped;
  {
    absl::MutexLock lock(&mu_);
    if (!stop_.has_value() && !closed_) {
      pending_.push_back({version, std::move(done)});
      return;
    }
    stopped = stop_.value_or("restarting from a checkpoint");
  }
  done(absl::UnavailableError(absl::StrCat("server shutting down: ", stopped)));
}

void ServingControl::Close() {
  std::vector<Pending> answered;
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    answered.swap(pending_);
  }
  for (Pending& p : answered) {
    p.done(absl::UnavailableError(
        "server shutting down: restarting from a checkpoint: register again"));
  }
}

void ServingControl::Reopen() {
  absl::MutexLock lock(&mu_);
  closed_ = false;
}

ServingControl::Event ServingControl::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](ServingControl* c) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return c->stop_.has_value() || !c->pending_.empty();
      },
      this));
  Event event;
  if (stop_.has_value()) {
    event.stop = stop_;
  } else {
    event.restore = pending_.front().version;
  }
  return event;
}

void ServingControl::Answer(int64_t version, const absl::Status& status) {
  std::vector<Pending> answered;
  {
    absl::MutexLock lock(&mu_);
    std::vector<Pending> kept;
    for (Pending& p : pending_) {
      (p.version == version || status.ok() ? answered : kept).push_back(std::move(p));
    }
    pending_.swap(kept);
  }
  for (Pending& p : answered) {
    if (p.version == version) {
      p.done(status);
    } else {
      p.done(absl::UnavailableError(absl::StrCat(
          "the server is restarting from its checkpoint of version ", version,
          " (another worker's restore): register again")));
    }
  }
}

}  // namespace ps::server
