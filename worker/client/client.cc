#include "worker/client/client.h"

#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "common/tensor.h"
#include "worker/server_store.h"

namespace ps::worker::client {
namespace {

// The model's elements; kInvalidArgument naming the first tensor the store
// cannot take. Only F32 travels (the server keeps fp32; compression is the
// wire's business, not the signature's).
absl::StatusOr<int64_t> CheckSignature(const std::vector<ParamSpec>& signature) {
  if (signature.empty()) return absl::InvalidArgumentError("the signature has no tensors");
  std::set<std::string> names;
  int64_t total = 0;
  for (size_t i = 0; i < signature.size(); ++i) {
    const ParamSpec& spec = signature[i];
    const std::string which = absl::StrCat("tensor ", i, " ('", spec.name, "')");
    if (spec.name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", i, " has no name"));
    }
    if (!names.insert(spec.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(which, ": the name is given to an earlier tensor too"));
    }
    if (spec.dtype != DType::kF32) {
      return absl::InvalidArgumentError(absl::StrCat(which, " has dtype ", DTypeName(spec.dtype),
                                                     "; the parameter server takes F32 only"));
    }
    int64_t elements = 0;
    if (!CheckedNumElements(spec.shape, &elements) ||
        __builtin_add_overflow(total, elements, &total) ||
        total > std::numeric_limits<int64_t>::max() / static_cast<int64_t>(sizeof(float))) {
      return absl::InvalidArgumentError(
          absl::StrCat(which, " has shape ", ShapeToString(spec.shape),
                       ": a dimension is negative or the model's size overflows 64 bits"));
    }
  }
  return total;
}

absl::Status CheckProposed(absl::Span<const float> proposed, int64_t elements) {
  if (proposed.empty() || static_cast<int64_t>(proposed.size()) == elements) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("the initial values hold ", proposed.size(),
                                                 " elements; the model has ", elements));
}

}  // namespace

void Operation::Finish(absl::Status status) {
  status_ = std::move(status);
  done_.Notify();
}

bool Operation::WaitFor(absl::Duration timeout) const {
  if (timeout == absl::InfiniteDuration()) {
    done_.WaitForNotification();
    return true;
  }
  return done_.WaitForNotificationWithTimeout(timeout);
}

absl::Status Operation::status() const {
  if (!done()) return absl::InternalError("the operation is still in flight");
  return status_;
}

Client::Client(StoreMaker make_store) : make_store_(std::move(make_store)) {}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  ClientOptions copy = options;
  return Create([copy](int64_t steps_per_epoch) -> absl::StatusOr<std::unique_ptr<ParameterStore>> {
    RemoteStoreOptions remote = copy.remote;
    remote.steps_per_epoch = steps_per_epoch;
    PS_ASSIGN_OR_RETURN(ServerStore server, CreateServerStore(copy.servers, remote));
    return std::move(server.store);
  });
}

absl::StatusOr<std::unique_ptr<Client>> Client::Create(StoreMaker make_store) {
  if (!make_store) return absl::InvalidArgumentError("no store maker");
  // The store that registers is made by Register, which knows the epoch's
  // steps; this one only proves the options make one.
  PS_ASSIGN_OR_RETURN(std::unique_ptr<ParameterStore> probe, make_store(0));
  if (probe == nullptr) return absl::InvalidArgumentError("the store maker made no store");
  return std::unique_ptr<Client>(new Client(std::move(make_store)));
}

Client::~Client() {
  std::unique_ptr<ParameterStore> store;
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int64_t* in_flight) { return *in_flight == 0; }, &in_flight_));
    store = std::move(store_);
  }
  // Destroyed outside the lock: a store stops its threads (heartbeats,
  // shards) as it goes.
  store.reset();
}

absl::Status Client::CheckBlockingSlot(const char* call, bool exclusive) const {
  if (blocking_ != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(call, " while ", blocking_,
                     " runs on another thread: one blocking call at "
                     "a time"));
  }
  if (exclusive && in_flight_ > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(call, " while ", in_flight_,
                     " pushes and pulls are in flight: wait for their handles first"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ParameterStore*> Client::BeginBlocking(const char* call, bool exclusive) {
  absl::MutexLock lock(&mu_);
  if (!registered_) return absl::FailedPreconditionError(absl::StrCat(call, " before register"));
  PS_RETURN_IF_ERROR(CheckBlockingSlot(call, exclusive));
  blocking_ = call;
  blocking_exclusive_ = exclusive;
  return store_.get();
}

void Client::EndBlocking() {
  absl::MutexLock lock(&mu_);
  blocking_ = nullptr;
  blocking_exclusive_ = false;
}

void Client::AdoptRegistration(const ParameterStore::Registration& registration) {
  registration_ = registration;
  segment_ends_ = store_->SegmentEnds();
}

absl::StatusOr<ParameterStore::Registration> Client::Register(std::vector<ParamSpec> signature,
                                                              absl::Span<const float> proposed,
                                                              int64_t steps_per_epoch) {
  PS_ASSIGN_OR_RETURN(const int64_t elements, CheckSignature(signature));
  PS_RETURN_IF_ERROR(CheckProposed(proposed, elements));
  if (steps_per_epoch < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("steps_per_epoch is ", steps_per_epoch, "; 0 (none) or more"));
  }
  {
    absl::MutexLock lock(&mu_);
    if (registered_) {
      return absl::FailedPreconditionError(
          "register: this client is registered already (reconnect registers again)");
    }
    PS_RETURN_IF_ERROR(CheckBlockingSlot("register", /*exclusive=*/true));
    blocking_ = "register";
    blocking_exclusive_ = true;
  }
  // Unlocked: nobody else sees the store before it has registered.
  absl::StatusOr<std::unique_ptr<ParameterStore>> store = make_store_(steps_per_epoch);
  absl::StatusOr<ParameterStore::Registration> registration =
      store.ok() ? (*store)->Register(signature, proposed)
                 : absl::StatusOr<ParameterStore::Registration>(store.status());
  absl::MutexLock lock(&mu_);
  blocking_ = nullptr;
  blocking_exclusive_ = false;
  if (!registration.ok()) return registration.status();
  store_ = std::move(*store);
  signature_ = std::move(signature);
  registered_ = true;
  AdoptRegistration(*registration);
  return registration;
}

absl::StatusOr<ParameterStore::Registration> Client::registration() const {
  absl::MutexLock lock(&mu_);
  if (!registered_) return absl::FailedPreconditionError("registration before register");
  return registration_;
}

absl::StatusOr<std::vector<int64_t>> Client::SegmentEnds() const {
  absl::MutexLock lock(&mu_);
  if (!registered_) return absl::FailedPreconditionError("segment_ends before register");
  return segment_ends_;
}

absl::StatusOr<int64_t> Client::num_elements() const {
  absl::MutexLock lock(&mu_);
  if (!registered_) return absl::FailedPreconditionError("num_elements before register");
  return segment_ends_.empty() ? 0 : segment_ends_.back();
}

absl::StatusOr<ParameterStore*> Client::BeginSegments(const char* call, const char* what_step,
                                                      int64_t step, int first, int last,
                                                      size_t buffer_size) {
  absl::MutexLock lock(&mu_);
  if (!registered_) return absl::FailedPreconditionError(absl::StrCat(call, " before register"));
  if (blocking_ != nullptr && blocking_exclusive_) {
    return absl::FailedPreconditionError(
        absl::StrCat(call, " while ", blocking_,
                     " runs on another thread: it needs no push or pull in "
                     "flight"));
  }
  if (step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(call, " of ", what_step, " ", step, ", which is negative"));
  }
  const int segments = static_cast<int>(segment_ends_.size());
  if (first < 0 || last < first || last > segments) {
    return absl::InvalidArgumentError(
        absl::StrCat(call, " of segments [", first, ", ", last, "): the model has ", segments,
                     " segments, so 0 <= first <= last <= ", segments));
  }
  const int64_t elements = segment_ends_.empty() ? 0 : segment_ends_.back();
  if (static_cast<int64_t>(buffer_size) != elements) {
    return absl::InvalidArgumentError(absl::StrCat(call, " with a buffer of ", buffer_size,
                                                   " elements; the model has ", elements,
                                                   " (pass the whole flat buffer)"));
  }
  ++in_flight_;
  return store_.get();
}

ParameterStore::Done Client::FinishSegments(std::shared_ptr<Operation> op) {
  return [this, op = std::move(op)](absl::Status status) {
    // Uncounted first, so that a caller who has seen every handle done may
    // start an exclusive call at once. Then this client is not touched
    // again: the destructor may go on once in_flight_ reaches 0.
    {
      absl::MutexLock lock(&mu_);
      --in_flight_;
    }
    op->Finish(std::move(status));
  };
}

absl::StatusOr<std::shared_ptr<Operation>> Client::Push(int64_t iteration, int64_t num_samples,
                                                        int first, int last,
                                                        absl::Span<const float> gradient) {
  if (num_samples < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("push of a negative sample count ", num_samples));
  }
  PS_ASSIGN_OR_RETURN(ParameterStore * store,
                      BeginSegments("push", "iteration", iteration, first, last, gradient.size()));
  auto op = std::make_shared<Operation>();
  store->PushSegments(iteration, num_samples, first, last, gradient, FinishSegments(op));
  return op;
}

absl::StatusOr<std::shared_ptr<Operation>> Client::Pull(int64_t version, int first, int last,
                                                        absl::Span<float> params) {
  PS_ASSIGN_OR_RETURN(ParameterStore * store,
                      BeginSegments("pull", "version", version, first, last, params.size()));
  auto op = std::make_shared<Operation>();
  store->PullSegments(version, first, last, params, FinishSegments(op));
  return op;
}

absl::Status Client::WaitForVersion(int64_t version) {
  PS_ASSIGN_OR_RETURN(ParameterStore * store, BeginBlocking("wait_for_version", true));
  const absl::Status status = store->WaitForVersion(version);
  EndBlocking();
  return status;
}

absl::StatusOr<int64_t> Client::PullAll(int64_t version, absl::Span<float> params) {
  PS_ASSIGN_OR_RETURN(const int64_t elements, num_elements());
  if (static_cast<int64_t>(params.size()) != elements) {
    return absl::InvalidArgumentError(absl::StrCat("pull_all with a buffer of ", params.size(),
                                                   " elements; the model has ", elements));
  }
  if (version < 0) {
    return absl::InvalidArgumentError(absl::StrCat("pull_all of a negative version ", version));
  }
  PS_ASSIGN_OR_RETURN(ParameterStore * store, BeginBlocking("pull_all", true));
  absl::StatusOr<int64_t> pulled = store->Pull(version, params);
  EndBlocking();
  return pulled;
}

absl::StatusOr<std::vector<int>> Client::Members(int64_t iteration) {
  PS_ASSIGN_OR_RETURN(const ParameterStore::Registration registration, this->registration());
  PS_ASSIGN_OR_RETURN(ParameterStore * store, BeginBlocking("members", false));
  absl::StatusOr<std::vector<int>> members = store->Members(iteration, registration.num_workers);
  EndBlocking();
  return members;
}

absl::StatusOr<float> Client::LossScale() const {
  const ParameterStore* store = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (!registered_) return absl::FailedPreconditionError("loss_scale before register");
    store = store_.get();  // kept until the client goes
  }
  return store->LossScale();
}

absl::StatusOr<ParameterStore::Registration> Client::Reconnect(absl::Span<const float> proposed) {
  PS_ASSIGN_OR_RETURN(const int64_t elements, num_elements());
  PS_RETURN_IF_ERROR(CheckProposed(proposed, elements));
  PS_ASSIGN_OR_RETURN(ParameterStore * store, BeginBlocking("reconnect", true));
  std::vector<ParamSpec> signature;
  {
    absl::MutexLock lock(&mu_);
    signature = signature_;
  }
  absl::StatusOr<ParameterStore::Registration> registration = store->Reconnect(signature, proposed);
  absl::MutexLock lock(&mu_);
  blocking_ = nullptr;
  blocking_exclusive_ = false;
  if (registration.ok()) AdoptRegistration(*registration);
  return registration;
}

}  // namespace ps::worker::client
