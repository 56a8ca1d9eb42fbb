#include "server/checkpointer.h"

#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace ps::server {

Checkpointer::Checkpointer(ParameterServer* server, CheckpointerOptions options,
                           int64_t last_version)
    : server_(server),
      options_(std::move(options)),
      last_version_(last_version),
      last_time_(absl::Now()) {
  if (options_.every_steps > 0 || options_.every > absl::ZeroDuration()) {
    thread_ = std::thread([this] { Loop(); });
  }
}

Checkpointer::~Checkpointer() { Stop(); }

void Checkpointer::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

int64_t Checkpointer::last_version() const {
  absl::MutexLock lock(&mu_);
  return last_version_;
}

absl::Time Checkpointer::last_write_time() const {
  absl::MutexLock lock(&mu_);
  return last_time_;
}

void Checkpointer::Log(const std::string& line) const {
  if (options_.log) options_.log(line);
}

void Checkpointer::Loop() {
  // Checks the stop flag at least every 200 ms; otherwise waits on the
  // server's version by steps (a condition, not a poll of it); by time
  // alone, it looks every 200 ms.
  constexpr absl::Duration kTick = absl::Milliseconds(200);
  for (;;) {
    int64_t last;
    absl::Time last_time;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      // After a failure, the version it tried counts as done: the next try
      // is at the next due point, not at once (a write that fails fast
      // would otherwise copy the model under the server's lock in a loop).
      last = std::max(last_version_, failed_version_);
      last_time = last_time_;
    }
    bool due = false;
    if (options_.every_steps > 0) {
      // Versions that are multiples of every_steps (the first after a
      // resumed one included).
      const int64_t next = (std::max<int64_t>(last, 0) / options_.every_steps + 1) * options_.every_steps;
      due = server_->WaitForVersion(next, absl::Now() + kTick).ok();
    } else {
      absl::SleepFor(kTick);
    }
    if (!due && options_.every > absl::ZeroDuration()) {
      due = absl::Now() - last_time >= options_.every && server_->initialized() &&
            server_->version() > last;
    }
    if (!due) continue;
    const absl::Status status = CaptureAndWrite(absl::InfiniteFuture());
    if (!status.ok() && status.code() != absl::StatusCode::kCancelled) {
      const int64_t tried = server_->version();
      Log(absl::StrCat("checkpoint of version ", tried,
                       " failed (will try again when the next is due): ", status.ToString()));
      absl::MutexLock lock(&mu_);
      last_time_ = absl::Now();
      failed_version_ = std::max(failed_version_, tried);
    }
  }
}

absl::Status Checkpointer::CaptureAndWrite(absl::Time deadline) {
  // The capture may be served on a push thread after this call gives up
  // waiting: the slot outlives both.
  struct Slot {
    absl::Mutex mu;
    bool ready ABSL_GUARDED_BY(mu) = false;
    ParameterServer::State state ABSL_GUARDED_BY(mu);
  };
  auto slot = std::make_shared<Slot>();
  server_->CaptureState([slot](ParameterServer::State state) {
    absl::MutexLock lock(&slot->mu);
    slot->state = std::move(state);
    slot->ready = true;
  });
  ParameterServer::State state;
  {
    absl::MutexLock lock(&slot->mu);
    // Wake up for Stop too (checked every 200 ms: Stop sets the flag under
    // another lock).
    for (;;) {
      const absl::Time until = std::min(deadline, absl::Now() + absl::Milliseconds(200));
      if (slot->mu.AwaitWithDeadline(absl::Condition(&slot->ready), until)) break;
      if (absl::Now() >= deadline) {
        server_->CancelCaptures();
        return absl::DeadlineExceededError(
            "the iteration in progress did not complete before the deadline, so there is no "
            "version boundary to save");
      }
      bool stopping;
      {
        absl::MutexLock stop_lock(&mu_);
        stopping = stopping_;
      }
      if (stopping && deadline == absl::InfiniteFuture()) {
        server_->CancelCaptures();
        return absl::CancelledError("stopping");
      }
    }
    state = std::move(slot->state);
  }
  const absl::Time start = absl::Now();
  CheckpointContents contents;
  contents.version = state.version;
  contents.steps_per_epoch = state.steps_per_epoch;
  contents.job = options_.job;
  contents.signature = std::move(state.signature);
  contents.parameters = std::move(state.parameters);
  contents.momentum = std::move(state.momentum);
  contents.loss_scale = state.loss_scale;
  contents.loss_scale_clean_iterations = state.loss_scale_clean_iterations;
  contents.loss_scale_skipped_iterations = state.loss_scale_skipped_iterations;
  PS_ASSIGN_OR_RETURN(const std::string manifest, WriteCheckpoint(options_.files, contents));
  {
    absl::MutexLock lock(&mu_);
    last_version_ = contents.version;
    last_time_ = absl::Now();
  }
  Log(absl::StrCat("checkpoint of version ", contents.version, " written to ", manifest, " in ",
                   absl::ToInt64Milliseconds(absl::Now() - start), " ms"));
  return absl::OkStatus();
}

absl::Status Checkpointer::WriteFinal(absl::Time deadline) {
  Stop();
  if (!server_->initialized()) return absl::OkStatus();  // nothing trained yet
  if (server_->version() == last_version() && last_version() >= 0) return absl::OkStatus();
  return CaptureAndWrite(deadline);
}

namespace {

// A float as the shortest text (6 to 9 significant digits) that reads back
// to the same float: StrCat's 6 made 0.1234567 and 0.1234568 one job.
std::string ExactFloat(float x) {
  std::string text;
  for (int digits = 6; digits <= 9; ++digits) {
    text = absl::StrFormat("%.*g", digits, x);
    double back = 0;
    if (absl::SimpleAtod(text, &back) && static_cast<float>(back) == x) break;
  }
  return text;
}

// Two settings' texts name the same value: the same text, or, for numbers
// with a fraction or an exponent, the same float (a checkpoint written with
// 6 digits, "0.9", still matches "0.899999976").
bool SameSetting(const std::string& a, const std::string& b) {
  if (a == b) return true;
  auto fractional = [](const std::string& s) {
    return s.find_first_of(".eE") != std::string::npos;
  };
  double x = 0, y = 0;
  return (fractional(a) || fractional(b)) && absl::SimpleAtod(a, &x) &&
         absl::SimpleAtod(b, &y) && static_cast<float>(x) == static_cast<float>(y);
}

}  // namespace

std::map<std::string, std::string> JobSettings(const ParameterServerOptions& options) {
  const OptimizerOptions& optimizer = options.optimizer;
  const LrSchedule& schedule = optimizer.schedule;
  std::map<std::string, std::string> job = {
      {"num_workers", absl::StrCat(options.num_workers)},
      {"consistency", options.consistency->Name()},
      {"lr", ExactFloat(optimizer.sgd.lr)},
      {"momentum", ExactFloat(optimizer.sgd.momentum)},
      {"weight_decay", ExactFloat(optimizer.sgd.weight_decay)},
      {"nesterov", optimizer.sgd.nesterov ? "true" : "false"},
      {"lr_decay_every", absl::StrCat(schedule.step_size)},
      {"lr_decay_gamma", ExactFloat(schedule.gamma)},
      {"lr_decay_unit", schedule.unit == LrSchedule::Unit::kEpochs ? "epochs" : "steps"},
      {"lr_warmup_steps", absl::StrCat(schedule.warmup_steps)},
  };
  // Only when on, so that checkpoints written before loss scaling existed
  // still match a job without it.
  if (options.loss_scale.dynamic) {
    job["loss_scale"] = absl::StrCat("dynamic initial ", ExactFloat(options.loss_scale.initial),
                                     " growth ", options.loss_scale.growth_interval);
  }
  return job;
}

std::string JobDifferences(const std::map<std::string, std::string>& saved,
                           const std::map<std::string, std::string>& current) {
  // Every key of either: a setting the checkpoint has and this job has not
  // (its dynamic loss scaling, say) differs as much as the reverse.
  std::set<std::string> keys;
  for (const auto& [key, value] : saved) keys.insert(key);
  for (const auto& [key, value] : current) keys.insert(key);
  auto value_in = [](const std::map<std::string, std::string>& settings,
                     const std::string& key) -> std::string {
    auto it = settings.find(key);
    return it == settings.end() ? "(none)" : it->second;
  };
  std::vector<std::string> differences;
  for (const std::string& key : keys) {
    const std::string was = value_in(saved, key);
    const std::string now = value_in(current, key);
    if (!SameSetting(was, now)) {
      differences.push_back(absl::StrCat(key, " ", was, " in the checkpoint, ", now, " now"));
    }
  }
  return absl::StrJoin(differences, "; ");
}

}  // namespace ps::server
