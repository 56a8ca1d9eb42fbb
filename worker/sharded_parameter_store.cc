#include "worker/sharded_parameter_store.h"

#include <algorithm>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"

namespace ps::worker {

// Moves a shard's RPC lanes into its own block of lanes; other events pass
// through unchanged.
class ShardedParameterStore::LaneShift final : public EventObserver {
 public:
  LaneShift(EventObserver* next, int shard) : next_(next), shard_(shard) {}
  void OnEvent(const TimedEvent& event) override {
    if (event.lane < RpcLane(0)) {
      next_->OnEvent(event);
      return;
    }
    TimedEvent moved = event;
    moved.lane = RpcLane(shard_ * kRpcLanesPerShard + (event.lane - RpcLane(0)) % kRpcLanesPerShard);
    next_->OnEvent(moved);
  }

 private:
  EventObserver* const next_;
  const int shard_;
};

ShardedParameterStore::ShardedParameterStore(const ShardedStoreOptions& options)
    : options_(options) {}

ShardedParameterStore::~ShardedParameterStore() = default;

absl::StatusOr<std::unique_ptr<RemoteParameterStore>> ShardedParameterStore::MakeStore(
    Shard& shard, int rank) const {
  RemoteStoreOptions remote = options_.remote;
  remote.server_address = shard.address;
  remote.rank = rank;
  if (remote.observer != nullptr) {
    shard.observer = std::make_unique<LaneShift>(remote.observer, shard.index);
    remote.observer = shard.observer.get();
  }
  return RemoteParameterStore::Create(remote);
}

absl::StatusOr<std::unique_ptr<ShardedParameterStore>> ShardedParameterStore::Create(
    const ShardedStoreOptions& options) {
  if (options.shard_addresses.empty()) return absl::InvalidArgumentError("no shard addresses");
  std::set<std::string> seen;
  for (const std::string& address : options.shard_addresses) {
    if (address.empty()) return absl::InvalidArgumentError("an empty shard address");
    if (!seen.insert(address).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard address ", address, " is listed twice"));
    }
  }
  std::unique_ptr<ShardedParameterStore> store(new ShardedParameterStore(options));
  // Vet the remote options once, as every shard will use them.
  Shard probe;
  probe.address = options.shard_addresses[0];
  PS_RETURN_IF_ERROR(store->MakeStore(probe, options.remote.rank).status());
  return store;
}

absl::Status ShardedParameterStore::NameShard(const Shard& shard,
                                              const absl::Status& status) const {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat("shard ", shard.index, " of ", num_shards(),
                                                  " (", shard.address, "): ", status.message()));
}

absl::Status ShardedParameterStore::OnEveryShard(const std::function<absl::Status(Shard&)>& fn) {
  return threads_->RunOnAll(
      [&](int i) { return NameShard(shards_[i], fn(shards_[i])); });
}

absl::Span<const float> ShardedParameterStore::PartOf(const Shard& shard,
                                                      absl::Span<const float> proposed) const {
  const ShardPart& part = plan_.shards[shard.index];
  return static_cast<int64_t>(proposed.size()) == num_parameters_
             ? proposed.subspan(part.flat_begin, part.elements())
             : absl::Span<const float>();
}

absl::Status ShardedParameterStore::CheckAgreement(
    const std::vector<Registration>& registrations, bool same_version) const {
  const Registration& decided = registrations[0];
  const Shard& first = shards_[0];
  for (size_t i = 1; i < shards_.size(); ++i) {
    const Registration& r = registrations[i];
    if (r.optimizer != decided.optimizer) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", shards_[i].index, " (", shards_[i].address, ") runs --optimizer=", r.optimizer,
          " but shard ", first.index, " (", first.address, ") --optimizer=", decided.optimizer,
          ": start every shard with the same --optimizer"));
    }
    if (r.consistency != decided.consistency ||
        (r.loss_scale > 0) != (decided.loss_scale > 0) ||
        r.dynamic_members != decided.dynamic_members) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", shards_[i].index, " (", shards_[i].address, ") runs another consistency, ",
          "loss scaling or policy on a lost worker than shard ", first.index, " (", first.address,
          "): start every shard with the same --consistency, --loss_scale and --on_worker_loss"));
    }
    if (r.job_run != decided.job_run) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", shards_[i].index, " of ", num_shards(), " (", shards_[i].address,
          ") holds the state of job run '", r.job_run, "' but shard ", first.index, " (",
          first.address, ") of run '", decided.job_run,
          "': shards of different runs (one started with another job's --checkpoint_dir?)"));
    }
    if (r.rank != decided.rank || r.num_workers != decided.num_workers ||
        (same_version && r.version != decided.version)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", shards_[i].index, " (", shards_[i].address, ") gave rank ", r.rank, " of ",
          r.num_workers, " workers at version ", r.version, " but shard ", first.index, " (",
          first.address, ") gave rank ", decided.rank, " of ", decided.num_workers,
          " at version ", decided.version, ": are the shards of one job, started alike?"));
    }
  }
  return absl::OkStatus();
}

absl::Status ShardedParameterStore::RestoreAbove(const std::vector<Registration>& registrations,
                                                 int64_t version) {
  return OnEveryShard([&](Shard& shard) -> absl::Status {
    if (registrations[&shard - shards_.data()].version <= version) return absl::OkStatus();
    return shard.store->Restore(version);
  });
}

absl::StatusOr<ParameterStore::Registration> ShardedParameterStore::Reconnect(
    const std::vector<ParamSpec>& signature, absl::Span<const float> proposed) {
  if (shards_.empty() || shards_[0].store == nullptr) {
    return absl::FailedPreconditionError("Reconnect before Register");
  }
  if (registration_.consistency.independent_steps()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "a sharded job under ", registration_.consistency.Name(),
        " consistency cannot recover a lost shard: its versions count updates, not iterations, "
        "so the shards have no common version to resume at (run sync or ssp, or one server)"));
  }
  registered_ = false;
  const Clock& clock = *options_.remote.clock;
  const int64_t start_ns = clock.NowNanos();
  const int64_t give_up_ns = clock.DeadlineAfter(options_.remote.reconnect_timeout);
  auto log = [&](const std::string& line) {
    if (options_.remote.log) options_.remote.log(line);
  };
  std::vector<Registration> registrations(shards_.size());
  // Whether registrations propose this run: not at first, so that a shard
  // that came back without state answers none.
  bool propose = false;
  for (int round = 1;; ++round) {
    if (round > 1 && clock.NowNanos() >= give_up_ns) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the shards did not come to one version within ",
          absl::FormatDuration(absl::Nanoseconds(clock.NowNanos() - start_ns))));
    }
    // 1. Every shard again, concurrently, each store asking for the rank it
    //    held.
    PS_RETURN_IF_ERROR(OnEveryShard([&](Shard& shard) -> absl::Status {
      const ShardPart& part = plan_.shards[shard.index];
      shard.store->ProposeJobRun(propose ? job_run_ : "");
      PS_ASSIGN_OR_RETURN(registrations[&shard - shards_.data()],
                          shard.store->Reconnect(part.signature(), PartOf(shard, proposed)));
      return absl::OkStatus();
    }));
    // 2. One job and one run (the one this store registered with, so that a
    //    shard resumed from another run's checkpoints is named). A shard with
    //    no run came back without state: fine while every shard is at
    //    version 0 (the job starts again; the next round gives it this
    //    run), refused once another is past it.
    size_t furthest = 0;
    std::vector<size_t> stateless;
    for (size_t i = 0; i < shards_.size(); ++i) {
      if (registrations[i].version > registrations[furthest].version) furthest = i;
      if (job_run_.empty()) continue;
      if (registrations[i].job_run.empty()) {
        stateless.push_back(i);
      } else if (registrations[i].job_run != job_run_) {
        return absl::FailedPreconditionError(absl::StrCat(
            "shard ", shards_[i].index, " of ", num_shards(), " (", shards_[i].address,
            ") came back with the state of another job run ('", registrations[i].job_run,
            "', this job's is '", job_run_, "'): was it restarted with another job's "
            "--checkpoint_dir? Restart it with its own"));
      }
    }
    if (!stateless.empty()) {
      const size_t i = stateless[0];
      if (registrations[furthest].version > 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "shard ", shards_[i].index, " of ", num_shards(), " (", shards_[i].address,
            ") came back without this job's state (no checkpoint: started without its "
            "--checkpoint_dir, or lost before its first checkpoint was written) while shard ",
            shards_[furthest].index, " (", shards_[furthest].address, ") is at version ",
            registrations[furthest].version, ": restart it with its own checkpoint directory"));
      }
      propose = true;
      continue;
    }
    PS_RETURN_IF_ERROR(CheckAgreement(registrations, /*same_version=*/false));
    // 3. The consistent cut: the least version; done once every shard is there.
    size_t lowest = 0;
    for (size_t i = 1; i < shards_.size(); ++i) {
      if (registrations[i].version < registrations[lowest].version) lowest = i;
    }
    const int64_t cut = registrations[lowest].version;
    std::vector<std::string> versions;
    bool agree = true;
    for (size_t i = 0; i < shards_.size(); ++i) {
      versions.push_back(absl::StrCat("shard ", shards_[i].index, " at ", registrations[i].version));
      agree = agree && registrations[i].version == cut;
    }
    if (agree) {
      registration_ = registrations[lowest];
      registered_ = true;
      if (round > 1) {
        log(absl::StrCat("every shard resumes at version ", cut, " (", round - 1,
                         " round(s) of restores)"));
      }
      return registration_;
    }
    // 4. Every shard above the cut back to its checkpoint of it.
    log(absl::StrCat("shards disagree (", absl::StrJoin(versions, ", "),
                     "): asking those above version ", cut, " to restore their checkpoint of it"));
    const absl::Status restored = RestoreAbove(registrations, cut);
    if (!restored.ok() && !IsServerLost(restored) &&
        restored.code() != absl::StatusCode::kOutOfRange) {
      // kOutOfRange: a shard went lower meanwhile (another worker's
      // restore); the next round sees it. Anything else is final.
      return absl::Status(restored.code(), absl::StrCat(
          "cannot resume every shard at version ", cut, ", the version of shard ",
          shards_[lowest].index, " of ", num_shards(), " (", shards_[lowest].address,
          "): ",
          restored.message()));
    }
    if (clock.NowNanos() >= give_up_ns) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the shards did not come to one version within ",
          absl::FormatDuration(absl::Nanoseconds(clock.NowNanos() - start_ns)), " (",
          absl::StrJoin(versions, ", "), "); last restore: ", restored.ToString()));
    }
  }
}

std::string ShardedParameterStore::NewJobRun() {
  std::random_device random;
  return absl::StrFormat("%08x%08x", random(), random());
}

absl::StatusOr<ParameterStore::Registration> ShardedParameterStore::Register(
    const std::vector<ParamSpec>& signature, absl::Span<const float> proposed) {
  registered_ = false;
  PS_ASSIGN_OR_RETURN(plan_, PlanShards(signature, num_shards(), options_.plan));
  num_parameters_ = plan_.num_parameters;
  shards_.clear();
  for (int s = 0; s < num_shards(); ++s) {
    if (plan_.shards[s].empty()) continue;
    Shard shard;
    shard.index = s;
    shard.address = options_.shard_addresses[s];
    shards_.push_back(std::move(shard));
  }
  // An empty signature: let shard 0 say what it thinks of it.
  if (shards_.empty()) {
    Shard shard;
    shard.address = options_.shard_addresses[0];
    shards_.push_back(std::move(shard));
  }
  threads_ = std::make_unique<DeviceThreads>(static_cast<int>(shards_.size()));
  auto sub_signature = [&](const Shard& shard) { return plan_.shards[shard.index].signature(); };

  // Step 1: the first shard decides the rank, and holds the run (its own,
  // or the one proposed here if it has none yet).
  Shard& first = shards_[0];
  PS_ASSIGN_OR_RETURN(first.store, MakeStore(first, options_.remote.rank));
  first.store->ProposeJobRun(job_run_.empty() ? NewJobRun() : job_run_);
  absl::StatusOr<Registration> got =
      first.store->Register(sub_signature(first), PartOf(first, proposed));
  if (!got.ok()) return NameShard(first, got.status());
  const Registration decided = *got;

  // Step 2: every other shard, concurrently, for that rank and run.
  std::vector<Registration> registrations(shards_.size(), decided);
  PS_RETURN_IF_ERROR(OnEveryShard([&](Shard& shard) -> absl::Status {
    if (&shard == &first) return absl::OkStatus();
    PS_ASSIGN_OR_RETURN(shard.store, MakeStore(shard, decided.rank));
    shard.store->ProposeJobRun(decided.job_run);
    PS_ASSIGN_OR_RETURN(registrations[&shard - shards_.data()],
                        shard.store->Register(sub_signature(shard), PartOf(shard, proposed)));
    return absl::OkStatus();
  }));

  // Step 3: one job, one run, one rank.
  PS_RETURN_IF_ERROR(CheckAgreement(registrations, /*same_version=*/false));
  job_run_ = decided.job_run;
  registration_ = decided;
  first_segment_.assign(1, 0);
  for (const Shard& shard : shards_) {
    first_segment_.push_back(first_segment_.back() +
                             static_cast<int>(shard.store->SegmentEnds().size()));
  }
  registered_ = true;
  // Step 4: one version. Shards that resumed from checkpoints of different
  // versions (the whole job restarted, say) are brought to one as
  // Reconnect does.
  for (const Registration& r : registrations) {
    if (r.version != decided.version) return Reconnect(signature, proposed);
  }
  return decided;
}

absl::StatusOr<std::vector<int>> ShardedParameterStore::Members(int64_t iteration,
                                                                int num_workers) {
  if (!registered_) return absl::FailedPreconditionError("Members before Register");
  // Each shard announces them in its own push replies; every shard drops a
  // lost worker at the same boundary (each hears its heartbeats stop), and
  // a job whose shards split the batch differently would train wrong, so a
  // disagreement is an error, never a choice.
  PS_ASSIGN_OR_RETURN(const std::vector<int> members,
                      shards_[0].store->Members(iteration, num_workers));
  for (size_t i = 1; i < shards_.size(); ++i) {
    absl::StatusOr<std::vector<int>> other = shards_[i].store->Members(iteration, num_workers);
    if (!other.ok()) return NameShard(shards_[i], other.status());
    if (*other != members) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the shards disagree on the workers of iteration ", iteration, ": shard ",
          shards_[0].index, " (", shards_[0].address, ") has ranks ",
          absl::StrJoin(members, ","), ", shard ", shards_[i].index, " (", shards_[i].address,
          ") ranks ", absl::StrJoin(*other, ",")));
    }
  }
  return members;
}

float ShardedParameterStore::LossScale() const {
  if (!registered_ || shards_.empty() || shards_[0].store == nullptr) return 0;
  return shards_[0].store->LossScale();
}

std::vector<int64_t> ShardedParameterStore::SegmentEnds() const {
  std::vector<int64_t> ends;
  if (!registered_) return ends;
  for (const Shard& shard : shards_) {
    const int64_t begin = plan_.shards[shard.index].flat_begin;
    for (int64_t end : shard.store->SegmentEnds()) ends.push_back(begin + end);
  }
  return ends;
}

std::vector<int> ShardedParameterStore::SegmentStreams() const {
  std::vector<int> streams;
  if (!registered_) return streams;
  for (const Shard& shard : shards_) {
    streams.insert(streams.end(), shard.store->SegmentEnds().size(), shard.index);
  }
  return streams;
}

void ShardedParameterStore::OnShardSegments(
    const char* what, int first, int last, size_t buffer_size,
    const std::function<void(Shard&, int, int, Done)>& start, Done done) {
  if (!registered_) return done(absl::FailedPreconditionError(absl::StrCat(what, " before Register")));
  if (first < 0 || last < first || last > first_segment_.back()) {
    return done(absl::InvalidArgumentError(absl::StrCat(
        what, " of segments [", first, ", ", last, "): the model has ", first_segment_.back())));
  }
  if (static_cast<int64_t>(buffer_size) != num_parameters_) {
    return done(absl::InvalidArgumentError(absl::StrCat(
        what, " with a buffer of ", buffer_size, " elements; the model has ", num_parameters_)));
  }
  // Every shard's outcome, kept until the last so the lowest shard's error
  // is the one reported, whichever finished first.
  struct Join {
    absl::Mutex mu;
    int pending ABSL_GUARDED_BY(mu) = 1;  // the starting itself
    std::vector<absl::Status> statuses;
    Done done;
  };
  auto join = std::make_shared<Join>();
  join->statuses.resize(shards_.size());
  join->done = std::move(done);
  auto finish_one = [join](size_t i, absl::Status status) {
    {
      absl::MutexLock lock(&join->mu);
      if (i < join->statuses.size()) join->statuses[i] = std::move(status);
      if (--join->pending > 0) return;
    }
    for (const absl::Status& s : join->statuses) {
      if (!s.ok()) return join->done(s);
    }
    join->done(absl::OkStatus());
  };
  for (size_t i = 0; i < shards_.size(); ++i) {
    const int lo = std::max(first, first_segment_[i]);
    const int hi = std::min(last, first_segment_[i + 1]);
    if (lo >= hi) continue;
    {
      absl::MutexLock lock(&join->mu);
      ++join->pending;
    }
    Shard& shard = shards_[i];
    start(shard, lo - first_segment_[i], hi - first_segment_[i],
          [this, &shard, i, finish_one](absl::Status status) {
            finish_one(i, NameShard(shard, status));
          });
  }
  finish_one(shards_.size(), absl::OkStatus());
}

void ShardedParameterStore::PushSegments(int64_t iteration, int64_t num_samples, int first,
                                         int last, absl::Span<const float> gradient, Done done) {
  OnShardSegments(
      "Push", first, last, gradient.size(),
      [&](Shard& shard, int lo, int hi, Done shard_done) {
        const ShardPart& part = plan_.shards[shard.index];
        shard.store->PushSegments(iteration, num_samples, lo, hi,
                                  gradient.subspan(part.flat_begin, part.elements()),
                                  std::move(shard_done));
      },
      std::move(done));
}

void ShardedParameterStore::PullSegments(int64_t version, int first, int last,
                                         absl::Span<float> params, Done done) {
  OnShardSegments(
      "Pull", first, last, params.size(),
      [&](Shard& shard, int lo, int hi, Done shard_done) {
        const ShardPart& part = plan_.shards[shard.index];
        shard.store->PullSegments(version, lo, hi,
                                  params.subspan(part.flat_begin, part.elements()),
                                  std::move(shard_done));
      },
      std::move(done));
}

absl::Status ShardedParameterStore::Push(int64_t iteration, int64_t num_samples,
                                         absl::Span<const float> gradient) {
  if (!registered_) return absl::FailedPreconditionError("Push before Register");
  if (static_cast<int64_t>(gradient.size()) != num_parameters_) {
    return absl::InvalidArgumentError(absl::StrCat("gradient has ", gradient.size(),
                                                   " elements, the model ", num_parameters_));
  }
  // Every shard's segments at once: the pipeline's call, waited for.
  return AwaitDone([&](Done done) {
    PushSegments(iteration, num_samples, 0, first_segment_.back(), gradient, std::move(done));
  });
}

absl::Status ShardedParameterStore::WaitForVersion(int64_t version) {
  if (!registered_) return absl::FailedPreconditionError("WaitForVersion before Register");
  return OnEveryShard([&](Shard& shard) { return shard.store->WaitForVersion(version); });
}

absl::StatusOr<int64_t> ShardedParameterStore::Pull(int64_t version, absl::Span<float> params) {
  if (!registered_) return absl::FailedPreconditionError("Pull before Register");
  if (static_cast<int64_t>(params.size()) != num_parameters_) {
    return absl::InvalidArgumentError(absl::StrCat("parameter buffer has ", params.size(),
                                                   " elements, the model ", num_parameters_));
  }
  std::vector<int64_t> versions(shards_.size(), version);
  PS_RETURN_IF_ERROR(OnEveryShard([&](Shard& shard) -> absl::Status {
    const ShardPart& part = plan_.shards[shard.index];
    PS_ASSIGN_OR_RETURN(versions[&shard - shards_.data()],
                        shard.store->Pull(version, params.subspan(part.flat_begin, part.elements())));
    return absl::OkStatus();
  }));
  // The shards update independently: parameters of two versions must not mix.
  for (size_t i = 1; i < shards_.size(); ++i) {
    if (versions[i] != versions[0]) {
      return absl::InternalError(absl::StrCat(
          "pull mixed versions: shard ", shards_[0].index, " (", shards_[0].address, ") sent ",
          versions[0], ", shard ", shards_[i].index, " (", shards_[i].address, ") sent ",
          versions[i]));
    }
  }
  return versions[0];
}

int64_t ShardedParameterStore::bytes_pushed() const {
  int64_t total = 0;
  for (const Shard& shard : shards_) total += shard.store != nullptr ? shard.store->bytes_pushed() : 0;
  return total;
}

std::map<int64_t, int64_t> ShardedParameterStore::staleness_histogram() const {
  std::map<int64_t, int64_t> total;
  for (const Shard& shard : shards_) {
    if (shard.store == nullptr) continue;
    for (const auto& [staleness, messages] : shard.store->staleness_histogram()) {
      total[staleness] += messages;
    }
  }
  return total;
}

int64_t ShardedParameterStore::bytes_pulled() const {
  int64_t total = 0;
  for (const Shard& shard : shards_) total += shard.store != nullptr ? shard.store->bytes_pulled() : 0;
  return total;
}

bool ShardedParameterStore::sent_initial_parameters() const {
  for (const Shard& shard : shards_) {
    if (shard.store != nullptr && shard.store->sent_initial_parameters()) return true;
  }
  return false;
}

}  // namespace ps::worker
