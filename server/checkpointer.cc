#include "server/checkpointer.h"

#include <deque>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/optimizer/optimizer.h"
#include "common/status_macros.h"

namespace ps::server {

struct Checkpointer::CaptureSlot {
  absl::Mutex mu;
  bool ready ABSL_GUARDED_BY(mu) = false;
  bool cancelled ABSL_GUARDED_BY(mu) = false;  // by Stop
  ParameterServer::State state ABSL_GUARDED_BY(mu);
};

// The captures of by-steps-alone checkpointing: each one's serving files
// the next multiple's at once, on the push thread that serves it, so the
// next request is in before the server can pass that multiple however late
// the checkpointer's thread runs. Shared with the callbacks, which may run
// after the checkpointer is gone.
struct Checkpointer::Chain {
  ParameterServer* server;  // outlives the checkpointer, so every callback
  int64_t every;
  absl::Mutex mu;
  bool stopped ABSL_GUARDED_BY(mu) = false;
  std::deque<std::shared_ptr<CaptureSlot>> slots ABSL_GUARDED_BY(mu);  // filed, in order
  // Captures filed and not yet taken by the thread stay below this, so
  // writes that lag hold at most this many copies of the state besides the
  // one being written; a multiple not filed for it is filed by the thread
  // when it catches up (and written if still in time).
  static constexpr size_t kMaxQueued = 2;
};

Checkpointer::Checkpointer(ParameterServer* server, CheckpointerOptions options,
                           int64_t last_version)
    : server_(server),
      options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : Clock::Real()),
      last_version_(last_version),
      last_time_ns_(clock_->NowNanos()),
      chain_(std::make_shared<Chain>()) {
  chain_->server = server_;
  chain_->every = std::max<int64_t>(options_.every_steps, 1);
  if (options_.every_steps > 0 || options_.every > absl::ZeroDuration()) {
    thread_ = std::thread([this] { Loop(); });
  }
}

Checkpointer::~Checkpointer() { Stop(); }

void Checkpointer::Stop() {
  {
    absl::MutexLock lock(&chain_->mu);
    chain_->stopped = true;
  }
  std::shared_ptr<CaptureSlot> capture;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    capture = capture_;
  }
  if (capture != nullptr) {
    absl::MutexLock lock(&capture->mu);
    capture->cancelled = true;
  }
  if (thread_.joinable()) {
    thread_.join();
    // A capture the chain filed as the thread gave up (StepLoop): dropped,
    // so that it holds no update back and a final capture is not served
    // at its multiple instead of the next boundary.
    if (options_.every_steps > 0 && options_.every == absl::ZeroDuration()) {
      server_->CancelCaptures();
    }
  }
}

int64_t Checkpointer::last_version() const {
  absl::MutexLock lock(&mu_);
  return last_version_;
}

absl::Duration Checkpointer::time_since_last_write() const {
  absl::MutexLock lock(&mu_);
  return absl::Nanoseconds(clock_->NowNanos() - last_time_ns_);
}

void Checkpointer::Log(const std::string& line) const {
  if (options_.log) options_.log(line);
}

bool Checkpointer::SleepUntilOrStop(int64_t deadline_ns) {
  absl::MutexLock lock(&mu_);
  return !clock_->AwaitWithDeadline(&mu_, absl::Condition(&stopping_), deadline_ns);
}

void Checkpointer::Loop() {
  // How long a wait on the server's version lasts before the stop flag is
  // looked at again: real time, since the server's wait takes a wall-clock
  // deadline and Stop cannot wake it.
  constexpr absl::Duration kStopTick = absl::Milliseconds(200);
  const int64_t every_ns = absl::ToInt64Nanoseconds(options_.every);
  if (options_.every_steps > 0 && every_ns == 0) return StepLoop();
  for (;;) {
    int64_t last;
    int64_t last_time_ns;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      // After a failure, the version it tried counts as done: the next try
      // is at the next due point, not at once (a write that fails fast
      // would otherwise copy the model under the server's lock in a loop).
      last = std::max(last_version_, failed_version_);
      last_time_ns = last_time_ns_;
    }
    bool due = false;
    if (options_.every_steps > 0) {
      // Versions that are multiples of every_steps (the first after a
      // resumed one included).
      const int64_t next = (std::max<int64_t>(last, 0) / options_.every_steps + 1) * options_.every_steps;
      due = server_->WaitForVersion(next, absl::Now() + kStopTick).ok();
      if (!due && every_ns > 0) {
        due = clock_->NowNanos() - last_time_ns >= every_ns && server_->initialized() &&
              server_->version() > last;
      }
    } else {
      // By time alone: asleep on the clock until `every` has passed, then
      // waiting for a version past the last one (its wait ends only once
      // the initial parameters exist, so version 0 is written too).
      const int64_t due_ns =
          last_time_ns > Clock::kNever - every_ns ? Clock::kNever : last_time_ns + every_ns;
      if (!SleepUntilOrStop(due_ns)) return;
      due = server_->WaitForVersion(last + 1, absl::Now() + kStopTick).ok();
    }
    if (!due) continue;
    const absl::Status status = CaptureAndWrite(Clock::kNever, /*background=*/true);
    if (!status.ok() && status.code() != absl::StatusCode::kCancelled) {
      const int64_t tried = server_->version();
      Log(absl::StrCat("checkpoint of version ", tried,
                       " failed (will try again when the next is due): ", status.ToString()));
      absl::MutexLock lock(&mu_);
      last_time_ns_ = clock_->NowNanos();
      failed_version_ = std::max(failed_version_, tried);
    }
  }
}

std::shared_ptr<Checkpointer::CaptureSlot> Checkpointer::FileCapture(bool background) {
  // The capture may be served on a push thread after the checkpointer
  // gives up waiting: the slot outlives both.
  auto slot = std::make_shared<CaptureSlot>();
  if (background) {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      absl::MutexLock slot_lock(&slot->mu);
      slot->cancelled = true;
      return slot;
    }
    capture_ = slot;
  }
  auto served = [slot](ParameterServer::State state) {
    absl::MutexLock lock(&slot->mu);
    slot->state = std::move(state);
    slot->ready = true;
  };
  server_->CaptureState(std::move(served));
  return slot;
}

absl::StatusOr<ParameterServer::State> Checkpointer::AwaitCapture(
    const std::shared_ptr<CaptureSlot>& slot, int64_t deadline_ns) {
  ParameterServer::State state;
  absl::Status waited;
  {
    absl::MutexLock lock(&slot->mu);
    auto served_or_cancelled = [&slot]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(slot->mu) {
      return slot->ready || slot->cancelled;
    };
    clock_->AwaitWithDeadline(&slot->mu, absl::Condition(&served_or_cancelled), deadline_ns);
    if (slot->ready) {
      state = std::move(slot->state);
    } else if (slot->cancelled) {
      waited = absl::CancelledError("stopping");
    } else {
      waited = absl::DeadlineExceededError(
          "the iteration in progress did not complete before the deadline, so there is no "
          "version boundary to save");
    }
  }
  {
    absl::MutexLock lock(&mu_);
    if (capture_ == slot) capture_.reset();
  }
  if (!waited.ok()) {
    server_->CancelCaptures();
    return waited;
  }
  return state;
}

absl::Status Checkpointer::Write(ParameterServer::State state) {
  const int64_t start_ns = clock_->NowNanos();
  CheckpointContents contents;
  contents.version = state.version;
  contents.steps_per_epoch = state.steps_per_epoch;
  contents.job = options_.job;
  if (options_.job_run) {
    if (std::string run = options_.job_run(); !run.empty()) contents.job[kJobRunSetting] = run;
  }
  contents.signature = std::move(state.signature);
  contents.parameters = std::move(state.parameters);
  contents.momentum = std::move(state.momentum);
  contents.loss_scale = state.loss_scale;
  contents.loss_scale_clean_iterations = state.loss_scale_clean_iterations;
  contents.loss_scale_skipped_iterations = state.loss_scale_skipped_iterations;
  PS_ASSIGN_OR_RETURN(const std::string manifest, WriteCheckpoint(options_.files, contents));
  const int64_t end_ns = clock_->NowNanos();
  {
    absl::MutexLock lock(&mu_);
    last_version_ = contents.version;
    last_time_ns_ = end_ns;
  }
  Log(absl::StrCat("checkpoint of version ", contents.version, " written to ", manifest, " in ",
                   (end_ns - start_ns) / 1'000'000, " ms"));
  return absl::OkStatus();
}

absl::Status Checkpointer::CaptureAndWrite(int64_t deadline_ns, bool background) {
  PS_ASSIGN_OR_RETURN(ParameterServer::State state,
                      AwaitCapture(FileCapture(background), deadline_ns));
  return Write(std::move(state));
}

void Checkpointer::FileChained(const std::shared_ptr<Chain>& chain, int64_t at) {
  auto slot = std::make_shared<CaptureSlot>();
  {
    absl::MutexLock lock(&chain->mu);
    if (chain->stopped || chain->slots.size() >= Chain::kMaxQueued) return;
    chain->slots.push_back(slot);  // before filing: a capture served at once files its next
  }
  chain->server->CaptureState(
      [chain, slot](ParameterServer::State state) {
        FileChained(chain, (state.version / chain->every + 1) * chain->every);
        absl::MutexLock lock(&slot->mu);
        slot->state = std::move(state);
        slot->ready = true;
      },
      at);
}

void Checkpointer::StepLoop() {
  constexpr absl::Duration kStopTick = absl::Milliseconds(200);
  // 1. Version 0 first (a server waiting for rank 0's parameters).
  while (!server_->WaitForVersion(0, absl::Now() + kStopTick).ok()) {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
  }
  // 2. Version 0 itself when there is no checkpoint yet (a shard lost
  //    before its first multiple can then resume with the others), else the
  //    first multiple past the newest; each next one as its predecessor is
  //    served.
  const int64_t last = last_version();
  auto next_multiple = [this](int64_t version) {
    return (version / options_.every_steps + 1) * options_.every_steps;
  };
  int64_t taken = -1;  // the version of the last capture taken
  FileChained(chain_, last < 0 ? 0 : next_multiple(last));
  for (;;) {
    std::shared_ptr<CaptureSlot> slot;
    bool stopped = false;
    bool refile = false;
    {
      absl::MutexLock lock(&chain_->mu);
      stopped = chain_->stopped;
      refile = !stopped && chain_->slots.empty();  // the chain was full when it would have filed
    }
    if (refile) FileChained(chain_, next_multiple(std::max<int64_t>(taken, 0)));
    {
      absl::MutexLock lock(&chain_->mu);
      if (chain_->slots.empty()) return;  // stopped, all written
      slot = chain_->slots.front();
      chain_->slots.pop_front();
    }
    absl::StatusOr<ParameterServer::State> state;
    if (stopped) {
      // Stopping: what is captured already is still written (a restore to
      // it waits for that), nothing more is waited for.
      absl::MutexLock lock(&slot->mu);
      if (!slot->ready) continue;
      state = std::move(slot->state);
    } else {
      {
        absl::MutexLock lock(&mu_);
        if (stopping_) {
          absl::MutexLock slot_lock(&slot->mu);
          slot->cancelled = true;
        }
        capture_ = slot;
      }
      state = AwaitCapture(slot, Clock::kNever);
      if (!state.ok()) continue;  // stopped: the captured ones are written next
    }
    const int64_t version = state->version;
    taken = version;
    // Taken later than its multiple (the server had passed it when it was
    // filed): not one every shard has, so not written.
    if (version % options_.every_steps != 0) continue;
    const absl::Status status = Write(*std::move(state));
    if (!status.ok()) {
      Log(absl::StrCat("checkpoint of version ", version,
                       " failed (will try again when the next is due): ", status.ToString()));
      absl::MutexLock lock(&mu_);
      last_time_ns_ = clock_->NowNanos();
      failed_version_ = std::max(failed_version_, version);
    }
  }
}

absl::Status Checkpointer::WriteFinal(absl::Duration timeout) {
  Stop();
  if (!server_->initialized()) return absl::OkStatus();  // nothing trained yet
  if (server_->version() == last_version() && last_version() >= 0) return absl::OkStatus();
  return CaptureAndWrite(clock_->DeadlineAfter(timeout), /*background=*/false);
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
  if (optimizer.kind != kSgdOptimizer) {
    // No SGD settings: the optimizer takes none.
    return {{"num_workers", absl::StrCat(options.num_workers)},
            {"consistency", options.consistency->Name()},
            {"optimizer", optimizer.kind}};
  }
  std::map<std::string, std::string> job = {
      {"num_workers", absl::StrCat(options.num_workers)},
      {"consistency", options.consistency->Name()},
      {"optimizer", optimizer.kind},
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
    if (it != settings.end()) return it->second;
    // Recorded since --optimizer exists: an older checkpoint's was sgd.
    return key == "optimizer" ? kSgdOptimizer : "(none)";
  };
  // Another optimizer takes other settings: that one difference says it.
  const std::string was_optimizer = value_in(saved, "optimizer");
  const std::string now_optimizer = value_in(current, "optimizer");
  if (was_optimizer != now_optimizer) {
    return absl::StrCat("optimizer ", was_optimizer, " in the checkpoint, ", now_optimizer,
                        " now");
  }
  std::vector<std::string> differences;
  for (const std::string& key : keys) {
    if (key == kJobRunSetting) continue;
    const std::string was = value_in(saved, key);
    const std::string now = value_in(current, key);
    if (!SameSetting(was, now)) {
      differences.push_back(absl::StrCat(key, " ", was, " in the checkpoint, ", now, " now"));
    }
  }
  return absl::StrJoin(differences, "; ");
}

}  // namespace ps::server
