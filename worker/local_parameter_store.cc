#include "worker/local_parameter_store.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/f32_pieces.h"
#include "common/push_checks.h"
#include "common/status_macros.h"

namespace ps::worker {

absl::StatusOr<std::unique_ptr<LocalParameterStore>> LocalParameterStore::Create(
    const OptimizerOptions& optimizer, int optimizer_threads,
    const LossScaleOptions& loss_scale) {
  PS_RETURN_IF_ERROR(ValidateOptimizerOptions(optimizer));
  if (optimizer.kind != kSgdOptimizer) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the in-process store applies SGD to the trainer's parameters; optimizer '",
        optimizer.kind, "' is the parameter server's (--optimizer)"));
  }
  PS_RETURN_IF_ERROR(ValidateLossScaleOptions(loss_scale));
  std::unique_ptr<LocalParameterStore> store(new LocalParameterStore());
  store->optimizer_options_ = optimizer;
  store->loss_scale_options_ = loss_scale;
  {
    absl::MutexLock lock(&store->mu_);
    store->loss_scale_ = LossScaleState::Initial(loss_scale);
  }
  store->device_ = std::make_unique<CpuDevice>(0, optimizer_threads);
  return store;
}

absl::StatusOr<ParameterStore::Registration> LocalParameterStore::Register(
    const std::vector<ParamSpec>& signature, absl::Span<const float> proposed) {
  absl::MutexLock lock(&mu_);
  Registration out;  // rank 0 of 1
  out.optimizer = optimizer_options_.kind;  // "sgd" (Create)
  if (optimizer_ != nullptr) {
    // This worker again: it resumes where the store is.
    if (signature != signature_) {
      return absl::FailedPreconditionError(
          "registered again with another model signature than the store's");
    }
    out.version = version_;
    out.loss_scale = loss_scale_.scale;
    return out;
  }
  if (signature.empty()) return absl::InvalidArgumentError("the signature is empty");
  std::vector<int64_t> ends;
  int64_t total = 0;
  for (const ParamSpec& spec : signature) {
    if (spec.dtype != DType::kF32) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", spec.name, "' is ",
                                                     DTypeName(spec.dtype),
                                                     "; the store holds F32 only"));
    }
    total += NumElements(spec.shape);
    ends.push_back(total);
  }
  if (static_cast<int64_t>(proposed.size()) != total) {
    return absl::InvalidArgumentError(absl::StrCat("initial parameters of ", proposed.size(),
                                                   " elements for a model of ", total));
  }
  // The server's rule: an epoch schedule needs the steps of an epoch.
  OptimizerOptions options = optimizer_options_;
  const int64_t steps_per_epoch = options.schedule.steps_per_epoch;
  if (steps_per_epoch < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the worker states ", steps_per_epoch, " steps per epoch"));
  }
  if (options.schedule.unit == LrSchedule::Unit::kEpochs &&
      options.schedule.step_size > 0 && steps_per_epoch < 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the learning rate decays every ", options.schedule.step_size,
        " epochs, but the worker states no steps per epoch"));
  }
  options.schedule.steps_per_epoch = std::max<int64_t>(1, steps_per_epoch);
  PS_ASSIGN_OR_RETURN(optimizer_, CreateOptimizer(options, total, device_.get()));
  signature_ = signature;
  segment_ends_ = std::move(ends);
  own_params_.assign(proposed.begin(), proposed.end());
  params_ = absl::MakeSpan(own_params_);
  // The store's own gradient buffer is made by the first push that copies
  // (none when the caller binds its buffers first).
  segment_version_.assign(signature_.size(), 0);
  pending_.assign(signature_.size(), false);
  pending_samples_.assign(signature_.size(), 0);
  pending_scale_.assign(signature_.size(), 1.f);
  pending_overflow_.assign(signature_.size(), false);
  out.loss_scale = loss_scale_.scale;
  return out;
}

std::vector<int64_t> LocalParameterStore::SegmentEnds() const {
  absl::MutexLock lock(&mu_);
  return segment_ends_;
}

int64_t LocalParameterStore::version() const {
  absl::MutexLock lock(&mu_);
  return version_;
}

int64_t LocalParameterStore::bytes_copied() const {
  absl::MutexLock lock(&mu_);
  return bytes_copied_;
}

absl::Status LocalParameterStore::CheckSegmentsLocked(int first, int last,
                                                      size_t flat_size) const {
  if (optimizer_ == nullptr) return absl::FailedPreconditionError("the store is not registered");
  if (first < 0 || last < first || last > static_cast<int>(segment_ends_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("segments [", first, ", ", last,
                                                   ") out of range: the model has ",
                                                   segment_ends_.size()));
  }
  if (static_cast<int64_t>(flat_size) != segment_ends_.back()) {
    return absl::InvalidArgumentError(absl::StrCat("a buffer of ", flat_size,
                                                   " elements for a model of ",
                                                   segment_ends_.back()));
  }
  return absl::OkStatus();
}

absl::Status LocalParameterStore::ApplyPendingLocked(int s) {
  if (!pending_[s]) return absl::OkStatus();
  pending_[s] = false;
  if (pending_overflow_[s]) {
    // Loss scaling's overflow: the update is skipped.
    pending_overflow_[s] = false;
    return absl::OkStatus();
  }
  // No samples (an empty part of the batch): the parameters stay, as on the
  // server.
  if (pending_samples_[s] == 0) return absl::OkStatus();
  const int64_t begin = SegmentBegin(s);
  const int64_t n = segment_ends_[s] - begin;
  // Update number segment_version_[s] - 1, in place.
  return optimizer_->ApplyRange(segment_version_[s] - 1, pending_samples_[s], begin,
                                gradients_.subspan(begin, n), params_.subspan(begin, n),
                                params_.subspan(begin, n), pending_scale_[s]);
}

absl::Status LocalParameterStore::PushLocked(int64_t iteration, int64_t num_samples, int first,
                                             int last, absl::Span<const float> gradient) {
  PS_RETURN_IF_ERROR(CheckSegmentsLocked(first, last, gradient.size()));
  const bool in_place = gradient.data() == gradients_.data();
  if (bound_ && !in_place) {
    return absl::InvalidArgumentError(
        "a push from another buffer than the gradient buffer bound to the store");
  }
  // 1. Everything is checked before anything is taken.
  if (iteration != version_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "push for iteration ", iteration, " but the store is at iteration ", version_));
  }
  // The server's checks (common/push_checks.h): the same pushes refused
  // with the same words in process and over the wire.
  PS_RETURN_IF_ERROR(CheckPushSamples(num_samples));
  PS_RETURN_IF_ERROR(CheckSameSamples(num_samples, iteration_samples_, "this worker", iteration));
  for (int s = first; s < last; ++s) {
    if (segment_version_[s] != version_) {
      return absl::AlreadyExistsError(absl::StrCat("'", signature_[s].name,
                                                   "' was pushed already in iteration ",
                                                   iteration));
    }
    if (bound_ && pending_[s]) {
      // Its gradient buffer holds this iteration's gradient already, so the
      // last one's update is lost: the caller broke the binding's contract.
      return absl::FailedPreconditionError(absl::StrCat(
          "'", signature_[s].name, "' is pushed for iteration ", iteration,
          " before its update of iteration ", iteration - 1, " was pulled"));
    }
  }
  std::vector<bool> overflow(last - first, false);
  for (int s = first; s < last; ++s) {
    const int64_t begin = SegmentBegin(s);
    const int64_t bytes = (segment_ends_[s] - begin) * static_cast<int64_t>(sizeof(float));
    const absl::string_view piece(reinterpret_cast<const char*>(gradient.data() + begin), bytes);
    // Under loss scaling an overflow: skipped, not refused.
    PS_ASSIGN_OR_RETURN(overflow[s - first],
                        CheckGradientValues({&piece, 1}, 0, signature_[s].name,
                                            /*loss_scaling=*/loss_scale_.scale > 0));
  }
  // 2. Taken: each segment's update waits for its parameters to be asked
  //    for. Unbound, the gradient is copied in (after the update of the last
  //    one it replaces).
  if (!in_place) EnsureOwnGradientsLocked();
  for (int s = first; s < last; ++s) {
    PS_RETURN_IF_ERROR(ApplyPendingLocked(s));
    if (!in_place) CopySegmentLocked(s, gradient.data(), own_gradients_.data());
    pending_[s] = true;
    pending_samples_[s] = num_samples;
    pending_scale_[s] = loss_scale_.scale > 0 ? loss_scale_.scale : 1.f;
    pending_overflow_[s] = overflow[s - first];
    if (overflow[s - first]) iteration_overflow_ = true;
    ++segment_version_[s];
  }
  iteration_samples_ = num_samples;
  segments_pushed_ += last - first;
  if (segments_pushed_ == static_cast<int>(segment_ends_.size())) {
    loss_scale_.Advance(iteration_overflow_, loss_scale_options_.growth_interval);
    iteration_overflow_ = false;
    ++version_;
    segments_pushed_ = 0;
    iteration_samples_ = -1;
  }
  return absl::OkStatus();
}

void LocalParameterStore::EnsureOwnGradientsLocked() {
  if (!own_gradients_.empty()) return;
  own_gradients_.assign(segment_ends_.back(), 0.f);
  gradients_ = absl::MakeConstSpan(own_gradients_);
}

void LocalParameterStore::CopySegmentLocked(int s, const float* from, float* to) {
  const int64_t begin = SegmentBegin(s);
  const int64_t bytes = (segment_ends_[s] - begin) * static_cast<int64_t>(sizeof(float));
  std::memcpy(to + begin, from + begin, bytes);
  bytes_copied_ += bytes;
}

absl::Status LocalParameterStore::PullLocked(int64_t version, int first, int last,
                                             absl::Span<float> params, bool newer_ok) {
  PS_RETURN_IF_ERROR(CheckSegmentsLocked(first, last, params.size()));
  for (int s = first; s < last; ++s) {
    if (segment_version_[s] < version) {
      return absl::DeadlineExceededError(
          absl::StrCat("version ", version, " of '", signature_[s].name,
                       "' does not exist: it is at ", segment_version_[s]));
    }
    if (!newer_ok && segment_version_[s] != version) {
      return absl::InternalError(absl::StrCat("pulled version ", segment_version_[s], " of '",
                                              signature_[s].name, "' where version ", version,
                                              " was asked for"));
    }
  }
  // A pull into another buffer copies the parameters out; the pending
  // updates read the gradients where the pushes left them (the bound
  // buffer, or the store's own copy), so the gradient buffer stays as it is.
  const bool in_place = params.data() == params_.data();
  for (int s = first; s < last; ++s) {
    PS_RETURN_IF_ERROR(ApplyPendingLocked(s));
    if (!in_place) CopySegmentLocked(s, params_.data(), params.data());
  }
  return absl::OkStatus();
}

absl::Status LocalParameterStore::Push(int64_t iteration, int64_t num_samples,
                                       absl::Span<const float> gradient) {
  absl::MutexLock lock(&mu_);
  const int segments = static_cast<int>(segment_ends_.size());
  return PushLocked(iteration, num_samples, 0, segments, gradient);
}

absl::Status LocalParameterStore::WaitForVersion(int64_t version) {
  absl::MutexLock lock(&mu_);
  // With one worker the version exists as soon as its push returns; waiting
  // for any other version would never end, so it is an error.
  if (optimizer_ != nullptr && version_ >= version) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "version ", version, " does not exist; the local store is at ", version_));
}

absl::StatusOr<int64_t> LocalParameterStore::Pull(int64_t version, absl::Span<float> params) {
  absl::MutexLock lock(&mu_);
  if (optimizer_ != nullptr && version_ < version) {
    return absl::DeadlineExceededError(absl::StrCat(
        "version ", version, " does not exist; the local store is at ", version_));
  }
  // As the server's: every segment is at least the store's version, some
  // (pushed in the iteration in progress) one newer.
  const int segments = static_cast<int>(segment_ends_.size());
  PS_RETURN_IF_ERROR(PullLocked(version_, 0, segments, params, /*newer_ok=*/true));
  return version_;
}

void LocalParameterStore::PushSegments(int64_t iteration, int64_t num_samples, int first,
                                       int last, absl::Span<const float> gradient, Done done) {
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    status = PushLocked(iteration, num_samples, first, last, gradient);
  }
  // Unlocked: `done` may start the next call (the scheduler pumps from it).
  done(std::move(status));
}

void LocalParameterStore::PullSegments(int64_t version, int first, int last,
                                       absl::Span<float> params, Done done) {
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    status = PullLocked(version, first, last, params, /*newer_ok=*/false);
  }
  done(std::move(status));
}

absl::Status LocalParameterStore::BindBuffers(absl::Span<const float> gradients,
                                              absl::Span<float> params) {
  absl::MutexLock lock(&mu_);
  if (optimizer_ == nullptr) return absl::FailedPreconditionError("the store is not registered");
  const int64_t size = segment_ends_.back();
  if (static_cast<int64_t>(gradients.size()) != size ||
      static_cast<int64_t>(params.size()) != size) {
    return absl::InvalidArgumentError(absl::StrCat("buffers of ", gradients.size(), " and ",
                                                   params.size(), " elements for a model of ",
                                                   size));
  }
  // The current parameters, every pushed update applied, move into the
  // caller's buffer; from here on the store's own are not needed.
  for (int s = 0; s < static_cast<int>(segment_ends_.size()); ++s) {
    PS_RETURN_IF_ERROR(ApplyPendingLocked(s));
  }
  if (params.data() != params_.data()) {
    std::memcpy(params.data(), params_.data(), size * sizeof(float));
  }
  params_ = params;
  gradients_ = gradients;
  bound_ = true;
  own_params_ = std::vector<float>();
  own_gradients_ = std::vector<float>();
  return absl::OkStatus();
}

}  // namespace ps::worker
