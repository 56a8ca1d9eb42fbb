#include "worker/sharded_parameter_store.h"

#include <set>

#include "absl/strings/str_cat.h"
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
  // Each shard's part of `proposed`; none when it is not a model's worth
  // (a shard that asks for it then says so).
  auto part_of = [&](const Shard& shard) {
    const ShardPart& part = plan_.shards[shard.index];
    return static_cast<int64_t>(proposed.size()) == num_parameters_
               ? proposed.subspan(part.flat_begin, part.elements())
               : absl::Span<const float>();
  };
  auto sub_signature = [&](const Shard& shard) { return plan_.shards[shard.index].signature(); };

  // Step 1: the first shard decides the rank.
  Shard& first = shards_[0];
  PS_ASSIGN_OR_RETURN(first.store, MakeStore(first, options_.remote.rank));
  absl::StatusOr<Registration> got = first.store->Register(sub_signature(first), part_of(first));
  if (!got.ok()) return NameShard(first, got.status());
  const Registration decided = *got;

  // Step 2: every other shard, concurrently, for that rank.
  std::vector<Registration> registrations(shards_.size(), decided);
  PS_RETURN_IF_ERROR(OnEveryShard([&](Shard& shard) -> absl::Status {
    if (&shard == &first) return absl::OkStatus();
    PS_ASSIGN_OR_RETURN(shard.store, MakeStore(shard, decided.rank));
    PS_ASSIGN_OR_RETURN(registrations[&shard - shards_.data()],
                        shard.store->Register(sub_signature(shard), part_of(shard)));
    return absl::OkStatus();
  }));

  // Step 3: one job, one rank, one version.
  for (size_t i = 1; i < shards_.size(); ++i) {
    const Registration& r = registrations[i];
    if (r.rank != decided.rank || r.num_workers != decided.num_workers ||
        r.version != decided.version) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", shards_[i].index, " (", shards_[i].address, ") gave rank ", r.rank, " of ",
          r.num_workers, " workers at version ", r.version, " but shard ", first.index, " (",
          first.address, ") gave rank ", decided.rank, " of ", decided.num_workers,
          " at version ", decided.version, ": are the shards of one job, started alike?"));
    }
  }
  registered_ = true;
  return decided;
}

absl::Status ShardedParameterStore::Push(int64_t iteration, int64_t num_samples,
                                         absl::Span<const float> gradient) {
  if (!registered_) return absl::FailedPreconditionError("Push before Register");
  if (static_cast<int64_t>(gradient.size()) != num_parameters_) {
    return absl::InvalidArgumentError(absl::StrCat("gradient has ", gradient.size(),
                                                   " elements, the model ", num_parameters_));
  }
  return OnEveryShard([&](Shard& shard) {
    const ShardPart& part = plan_.shards[shard.index];
    return shard.store->Push(iteration, num_samples,
                             gradient.subspan(part.flat_begin, part.elements()));
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
