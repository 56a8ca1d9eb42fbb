#include "worker/replica_overlap.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/collective.h"

namespace ps::worker {

class ReplicaOverlap::Hooks final : public model::ParameterHooks {
 public:
  Hooks(ReplicaOverlap* overlap, int device) : overlap_(overlap), device_(device) {}

  absl::Status BeforeForward(int64_t begin, int64_t end) override {
    return overlap_->CopyParameters(device_, begin, end);
  }
  void GradientsReady(int64_t begin, int64_t end) override {
    overlap_->Report(device_, begin, /*released=*/false);
  }
  void AfterBackward(int64_t begin, int64_t end) override {
    overlap_->Report(device_, begin, /*released=*/true);
  }

 private:
  ReplicaOverlap* const overlap_;
  const int device_;
};

ReplicaOverlap::~ReplicaOverlap() = default;

ReplicaOverlap::ReplicaOverlap(PushPullScheduler* scheduler, std::vector<float*> gradients,
                               std::vector<float*> parameters, int64_t num_parameters)
    : scheduler_(scheduler),
      gradients_(std::move(gradients)),
      parameters_(std::move(parameters)),
      num_parameters_(num_parameters),
      computing_(gradients_.size(), true),
      final_from_(gradients_.size(), num_parameters),
      released_from_(gradients_.size(), num_parameters),
      summed_from_(num_parameters),
      early_from_(num_parameters),
      ready_from_(num_parameters) {
  for (size_t d = 0; d < gradients_.size(); ++d) {
    hooks_.push_back(std::make_unique<Hooks>(this, static_cast<int>(d)));
  }
}

model::ParameterHooks* ReplicaOverlap::hooks(int d) { return hooks_[d].get(); }

absl::Status ReplicaOverlap::BeginStep(const std::vector<bool>& computing) {
  if (computing.size() != gradients_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("ReplicaOverlap: ", computing.size(),
                                                   " replicas named for ", gradients_.size()));
  }
  if (!computing[0] && std::find(computing.begin(), computing.end(), true) != computing.end()) {
    return absl::InvalidArgumentError(
        "ReplicaOverlap: replica 0 has no samples but another replica has: its gradients are "
        "the ones pushed");
  }
  computing_ = computing;
  summed_replicas_.clear();
  for (size_t d = 1; d < gradients_.size(); ++d) {
    if (computing_[d]) summed_replicas_.push_back(gradients_[d]);
  }
  return absl::OkStatus();
}

absl::Status ReplicaOverlap::CopyParameters(int d, int64_t begin, int64_t end) {
  if (absl::Status s = scheduler_->AwaitParameters(begin, end); !s.ok()) return s;
  if (d > 0) {
    std::memcpy(parameters_[d] + begin, parameters_[0] + begin,
                static_cast<size_t>(end - begin) * sizeof(float));
  }
  return absl::OkStatus();
}

void ReplicaOverlap::Report(int d, int64_t offset, bool released) {
  absl::MutexLock lock(&mu_);
  final_from_[d] = std::min(final_from_[d], offset);
  if (released) released_from_[d] = std::min(released_from_[d], offset);
  Advance();
}

void ReplicaOverlap::Advance() {
  int64_t all_final = 0, all_released = 0;
  for (size_t d = 0; d < gradients_.size(); ++d) {
    if (!computing_[d]) continue;
    all_final = std::max(all_final, final_from_[d]);
    all_released = std::max(all_released, released_from_[d]);
  }
  if (all_final < summed_from_) {
    Sum(all_final, summed_from_);
    summed_from_ = all_final;
  }
  // all_released >= all_final: every byte handed over is summed.
  if (all_released < ready_from_) {
    ready_from_ = all_released;
    scheduler_->GradientsReadyFrom(ready_from_);
  }
  if (summed_from_ < early_from_ && summed_from_ < ready_from_) {
    early_from_ = summed_from_;
    scheduler_->EarlyGradientsFrom(early_from_);
  }
}

void ReplicaOverlap::Sum(int64_t begin, int64_t end) const {
  SumInDeviceOrder(gradients_[0], summed_replicas_, begin, end);
}

void ReplicaOverlap::FinishStep() {
  absl::MutexLock lock(&mu_);
  // Every pass has returned: what no report covered is final everywhere.
  // (With no replica computing, nothing is summed: replica 0's gradients
  // are its empty shard's zeros.)
  std::fill(final_from_.begin(), final_from_.end(), 0);
  std::fill(released_from_.begin(), released_from_.end(), 0);
  Advance();
}

}  // namespace ps::worker
