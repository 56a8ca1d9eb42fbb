#include "worker/trainer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/f32_pieces.h"
#include "common/optimizer/optimizer.h"
#include "common/status_macros.h"
#include "worker/compute_mode_factory.h"
#include "worker/compute_mode_real.h"
#include "worker/device_overlap.h"
#include "worker/replica_overlap.h"
#include "worker/split_batch.h"
#include "worker/weights.h"

namespace ps::worker {
namespace {

double SecondsSince(const Clock& clock, int64_t start_ns) {
  return static_cast<double>(clock.NowNanos() - start_ns) / 1e9;
}

ComputeModeOptions ComputeModeOptionsOf(const TrainerOptions& options) {
  ComputeModeOptions compute;
  compute.replay = options.replay_compute;
  compute.replay_calibration_steps = options.replay_calibration_steps;
  compute.replay_step_seconds = options.replay_step_seconds;
  compute.slowdown = options.slowdown;
  compute.slowdown_period = options.slowdown_period;
  return compute;
}

// The trainer applies no optimizer: each version it pulls must be the
// parameters after the store's update ("sgd": the in-process store, a
// server with --optimizer=sgd).
absl::Status CheckStoreAppliesTheUpdate(const ParameterStore::Registration& registration) {
  if (registration.optimizer == kSgdOptimizer) return absl::OkStatus();
  if (registration.optimizer == kMeanGradientOptimizer) {
    return absl::FailedPreconditionError(
        "the server publishes mean gradients (--optimizer=none), not parameters, and this "
        "worker applies no optimizer of its own: use ps.torch with a local optimizer (see "
        "docs/training.md, \"The sum-only server\"), or start the server with --optimizer=sgd");
  }
  return absl::FailedPreconditionError(
      absl::StrCat("the store runs optimizer '", registration.optimizer,
                   "'; this worker trains only against one that applies sgd"));
}

}  // namespace

// Reports a step's phases back to back on the trainer lane: Begin(kind) ends
// the phase in progress, if any, and starts `kind` at the same clock reading,
// so the phases tile the step without gaps (one clock read per boundary). A
// phase still open when the object dies (an error return) is not reported.
class Trainer::StepPhases {
 public:
  StepPhases(EventObserver* observer, const Clock* clock, int64_t step)
      : observer_(observer), clock_(clock) {
    event_.lane = kTrainerLane;
    event_.step = step;
  }

  void Begin(EventKind kind, int64_t bytes = 0) {
    const int64_t now = clock_->NowNanos();
    Report(now);
    event_.kind = kind;
    event_.bytes = bytes;
    event_.start_ns = now;
    open_ = true;
  }
  void End() { Report(clock_->NowNanos()); }

 private:
  void Report(int64_t now) {
    if (!open_) return;
    event_.end_ns = now;
    observer_->OnEvent(event_);
    open_ = false;
  }

  EventObserver* const observer_;
  const Clock* const clock_;
  TimedEvent event_;
  bool open_ = false;
};

// Per-device state besides the model.
struct Trainer::Replica {
  Device* device = nullptr;
  Tensor inputs;   // [capacity, C, H, W]
  Tensor labels;   // [capacity] I32
  Tensor metrics;  // [2]: summed loss, correct count (accumulated on device)
  int64_t capacity = 0;
  // Pinned host staging for devices whose memory is not host memory.
  float* host_inputs = nullptr;
  int32_t* host_labels = nullptr;
  std::vector<float> cpu_scratch_images;
};

Trainer::Trainer(const TrainerOptions& options, std::unique_ptr<ComputeMode> compute,
                 std::vector<Device*> devices, ParameterStore* store,
                 const data::Dataset* train, const data::Dataset* test)
    : options_(options),
      compute_(std::move(compute)),
      devices_(std::move(devices)),
      store_(store),
      train_(train),
      test_(test),
      clock_(options.clock) {
  phase_observers_.Add(&split_observer_);
  if (options_.observer != nullptr) phase_observers_.Add(options_.observer);
}

Trainer::~Trainer() {
  device_overlap_.reset();  // first: its copies in flight tell the scheduler
  scheduler_.reset();  // then: its calls in flight use the buffers below
  if (!devices_.empty()) {
    devices_[0]->DeallocateHost(host_gradients_);
    devices_[0]->DeallocateHost(host_parameters_);
  }
  for (auto& r : replica_state_) {
    r->device->DeallocateHost(r->host_inputs);
    r->device->DeallocateHost(r->host_labels);
  }
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const TrainerOptions& options,
                                                         const model::ModelConfig& model,
                                                         std::vector<Device*> devices,
                                                         ParameterStore* store,
                                                         const data::Dataset* train,
                                                         const data::Dataset* test,
                                                         const data::Dataset* validation) {
  if (devices.empty()) return absl::InvalidArgumentError("trainer needs at least one device");
  if (options.batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch size must be >= 1, got ", options.batch_size));
  }
  if (options.epochs < 1) {
    return absl::InvalidArgumentError(absl::StrCat("epochs must be >= 1, got ", options.epochs));
  }
  if (options.clock == nullptr) return absl::InvalidArgumentError("trainer needs a clock");
  PS_ASSIGN_OR_RETURN(std::unique_ptr<ComputeMode> compute,
                      MakeComputeMode(ComputeModeOptionsOf(options),
                                      static_cast<int>(devices.size()), options.clock));
  if (train == nullptr || train->size() == 0) {
    return absl::InvalidArgumentError("training dataset is empty");
  }
  if (train->sample_shape != model.input_shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset '", train->name, "' has samples of shape ", ShapeToString(train->sample_shape),
        " but the model expects ", ShapeToString(model.input_shape)));
  }
  std::unique_ptr<Trainer> trainer(
      new Trainer(options, std::move(compute), std::move(devices), store, train, test));
  trainer->validation_ = validation;
  PS_RETURN_IF_ERROR(trainer->Init(model));
  return trainer;
}

absl::Status Trainer::Init(const model::ModelConfig& model_config) {
  PS_RETURN_IF_ERROR(CreateReplicas(model_config));
  // The proposal: device 0's parameters where they lie when its memory is
  // host memory (no model-sized copy just to register), else a host copy.
  std::vector<float> proposed;
  absl::Span<const float> proposal;
  if (devices_[0]->is_host_memory()) {
    proposal = absl::MakeConstSpan(replicas_[0]->flat_parameters().data<float>(), num_parameters_);
  } else {
    proposed.resize(num_parameters_);
    PS_RETURN_IF_ERROR(replicas_[0]->flat_parameters().CopyToHost(absl::MakeSpan(proposed)));
    proposal = proposed;
  }
  PS_ASSIGN_OR_RETURN(registration_, store_->Register(replicas_[0]->parameters(), proposal));
  PS_RETURN_IF_ERROR(CheckStoreAppliesTheUpdate(registration_));
  // Registration decides how the global batch is split across workers, and
  // so the largest shard each device sees.
  PS_RETURN_IF_ERROR(CreateReplicaState());
  PS_RETURN_IF_ERROR(BindWireBuffers());
  // Rank 0 may have to send its initial parameters again to a server that
  // restarted without a checkpoint (see Recover).
  if (options_.recover_from_server_loss && registration_.rank == 0) {
    initial_parameters_.assign(proposal.begin(), proposal.end());
  }
  // Overlap needs each layer's gradients as backward makes them, in memory
  // the pushes can read: CPU devices' own (ReplicaOverlap), or one device's
  // copied region by region to the pinned host buffers (DeviceOverlap;
  // several such devices keep the reduction after backward). Under loss
  // scaling a step's pushes wait for the whole backward: an overflow
  // anywhere in it must reach every chunk (see loss_scaling_). Known before
  // StartFrom builds the scheduler: staging serves overlap only.
  loss_scaling_ = registration_.loss_scale > 0;
  const bool host_memory = std::all_of(devices_.begin(), devices_.end(), [](Device* d) {
    return d->is_cpu() && d->is_host_memory();
  });
  const bool one_staged = devices_.size() == 1 && !devices_[0]->is_host_memory();
  overlapping_ = options_.overlap && !loss_scaling_ && (host_memory || one_staged);
  if (overlapping_ && one_staged) {
    device_overlap_ = std::make_unique<DeviceOverlap>(
        devices_[0], replicas_[0]->flat_gradients().mutable_data<float>(),
        replicas_[0]->flat_parameters().mutable_data<float>(), host_gradients_,
        host_parameters_, num_parameters_);
  }
  // The version registered at may be gone before it is pulled: a shard
  // another worker's registration restored (a sharded job resumed from
  // checkpoints of different versions), or a server lost meanwhile.
  if (const absl::Status started = StartFrom(registration_.version); !started.ok()) {
    if (!options_.recover_from_server_loss || !IsServerLost(started)) return started;
    PS_RETURN_IF_ERROR(Recover(started).status());
  }
  ComputeSetup setup;
  setup.rank = registration_.rank;
  setup.stage_batch = [this](int64_t pass) { return StageCalibrationBatch(pass); };
  PS_RETURN_IF_ERROR(compute_->Prepare(setup));
  order_epoch_ = -1;  // the data order starts afresh for the real steps
  for (Device* device : devices_) device->ResetCounters();
  return absl::OkStatus();
}

absl::Status Trainer::CreateReplicas(const model::ModelConfig& model_config) {
  for (Device* device : devices_) device->set_gemm_precision(options_.precision);
  device_threads_ = std::make_unique<DeviceThreads>(static_cast<int>(devices_.size()));
  PS_ASSIGN_OR_RETURN(collective_, DeviceCollective::Create(devices_, device_threads_.get()));
  for (size_t d = 0; d < devices_.size(); ++d) {
    PS_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> model,
                        model::Model::Create(model_config, devices_[d]));
    if (options_.observer != nullptr) {
      model->set_observer(options_.observer, clock_, DeviceLane(static_cast<int>(d)));
    }
    replicas_.push_back(std::move(model));
  }
  num_parameters_ = model::TotalElements(replicas_[0]->parameters());
  for (auto& replica : replicas_) PS_RETURN_IF_ERROR(replica->Initialize(options_.seed));
  if (!options_.init_weights.empty()) {
    // Read the file once, into device 0; its parameters reach the other
    // devices with StartFrom's broadcast, its buffers (batch-norm statistics)
    // are copied here.
    PS_RETURN_IF_ERROR(LoadWeights(options_.init_weights, *replicas_[0]));
    if (replicas_.size() > 1 && replicas_[0]->flat_buffers().num_elements() > 0) {
      PS_ASSIGN_OR_RETURN(std::vector<float> buffers, replicas_[0]->flat_buffers().ToVector());
      for (size_t d = 1; d < replicas_.size(); ++d) {
        PS_RETURN_IF_ERROR(replicas_[d]->flat_buffers().CopyFromHost(buffers));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Trainer::CreateReplicaState() {
  const Shape& sample = train_->sample_shape;
  const int64_t sample_elements = NumElements(sample);
  // A job that may shrink can leave this worker the whole global batch.
  const int64_t worker_part =
      SplitEvenly(options_.batch_size,
                  registration_.dynamic_members ? 1 : registration_.num_workers, 0)
          .size;
  const int64_t shard_capacity =
      std::max<int64_t>(1, SplitEvenly(worker_part, static_cast<int>(devices_.size()), 0).size);
  for (size_t d = 0; d < devices_.size(); ++d) {
    auto r = std::make_unique<Replica>();
    r->device = devices_[d];
    r->capacity = d == 0 ? std::max(shard_capacity, options_.eval_batch_size) : shard_capacity;
    Shape input_shape = {r->capacity};
    input_shape.insert(input_shape.end(), sample.begin(), sample.end());
    PS_ASSIGN_OR_RETURN(r->inputs, Tensor::Empty(r->device, input_shape));
    PS_ASSIGN_OR_RETURN(r->labels, Tensor::Empty(r->device, {r->capacity}, DType::kI32));
    PS_ASSIGN_OR_RETURN(r->metrics, Tensor::Zeros(r->device, {2}));
    if (!r->device->is_host_memory()) {
      PS_ASSIGN_OR_RETURN(void* images,
                          r->device->AllocateHost(r->capacity * sample_elements * sizeof(float)));
      r->host_inputs = static_cast<float*>(images);
      PS_ASSIGN_OR_RETURN(void* labels, r->device->AllocateHost(r->capacity * sizeof(int32_t)));
      r->host_labels = static_cast<int32_t*>(labels);
    }
    replica_state_.push_back(std::move(r));
  }
  return absl::OkStatus();
}

absl::Status Trainer::BindWireBuffers() {
  float* gradients = nullptr;
  float* parameters = nullptr;
  if (devices_[0]->is_host_memory()) {
    // Device 0's memory is host memory: push straight from its gradients,
    // pull straight into its parameters, no copy between host buffers.
    gradients = static_cast<float*>(replicas_[0]->flat_gradients().mutable_raw_data());
    parameters = static_cast<float*>(replicas_[0]->flat_parameters().mutable_raw_data());
  } else {
    PS_ASSIGN_OR_RETURN(void* grads, devices_[0]->AllocateHost(num_parameters_ * sizeof(float)));
    host_gradients_ = static_cast<float*>(grads);
    PS_ASSIGN_OR_RETURN(void* host_params,
                        devices_[0]->AllocateHost(num_parameters_ * sizeof(float)));
    host_parameters_ = static_cast<float*>(host_params);
    gradients = host_gradients_;
    parameters = host_parameters_;
  }

  wire_gradients_ = absl::MakeConstSpan(gradients, num_parameters_);
  wire_parameters_ = absl::MakeSpan(parameters, num_parameters_);
  // A store in this process works in those buffers themselves (updating the
  // parameters in place, reading the gradients where they lie) rather than
  // in copies of its own. The scheduler keeps the binding's contract: a
  // bucket's gradients are written again only by the backward after the
  // forward that waited for its pull.
  const absl::Status bound = store_->BindBuffers(wire_gradients_, wire_parameters_);
  if (!bound.ok() && !absl::IsUnimplemented(bound)) return bound;
  buffers_bound_ = bound.ok();
  return absl::OkStatus();
}

absl::Status Trainer::StartFrom(int64_t version) {
  // Exactly `version`: a worker that rejoins mid-iteration must recompute
  // that iteration from its parameters, even where the others' pushes have
  // already updated some.
  const int segments = static_cast<int>(store_->SegmentEnds().size());
  PS_RETURN_IF_ERROR(AwaitDone([&](ParameterStore::Done done) {
    store_->PullSegments(version, 0, segments, wire_parameters_, std::move(done));
  }));
  // Every replica holds the same buffers (batch-norm statistics) already; the
  // parameters come from device 0.
  PS_RETURN_IF_ERROR(LoadPulledParameters());
  // Staging holds pulls that come while backward still reads their layer
  // (overlap only); a store updating these buffers in place pulls at once,
  // so it has nothing to stage. Without either, no staging buffer.
  PushPullOptions push_pull = options_.push_pull;
  push_pull.stage_early_pulls &= !buffers_bound_ && overlapping_;
  PS_ASSIGN_OR_RETURN(scheduler_,
                      PushPullScheduler::Create(push_pull, store_, wire_gradients_,
                                                wire_parameters_, version,
                                                replicas_[0]->LayerParameterBegins()));
  return absl::OkStatus();
}

absl::Status Trainer::CatchUp(int64_t version) {
  PS_RETURN_IF_ERROR(store_->WaitForVersion(version));
  // Nothing is in flight (the epoch's communication has finished), and no
  // chunk can be past `version`: its next update needs this worker's push.
  PS_RETURN_IF_ERROR(AwaitDeviceCopies());
  scheduler_.reset();
  return StartFrom(version);
}

absl::Status Trainer::LoadPulledParameters() {
  if (host_parameters_ != nullptr) {
    PS_RETURN_IF_ERROR(devices_[0]->CopyHostToDevice(
        replicas_[0]->flat_parameters().mutable_raw_data(), host_parameters_,
        num_parameters_ * static_cast<int64_t>(sizeof(float)), CopyKind::kModel));
    // Overlapping, the next step's forward then copies none.
    if (device_overlap_ != nullptr) device_overlap_->ParametersCopied();
  }
  std::vector<Tensor*> params;
  for (auto& m : replicas_) params.push_back(&m->flat_parameters());
  return collective_->BroadcastFromRoot(params);
}

absl::Status Trainer::AwaitDeviceCopies() {
  return device_overlap_ == nullptr ? absl::OkStatus() : device_overlap_->AwaitCopies();
}

absl::StatusOr<int64_t> Trainer::Recover(const absl::Status& cause) {
  // The calls in flight fail (or finish) on their own: the scheduler waits
  // for them, since they hold the buffers. A failed step's copies may still
  // tell the scheduler: they land first.
  PS_RETURN_IF_ERROR(AwaitDeviceCopies());
  scheduler_.reset();
  const int num_workers = registration_.num_workers;
  const int rank = registration_.rank;
  std::vector<float> proposed = initial_parameters_;
  if (proposed.empty()) proposed.assign(num_parameters_, 0.f);  // not asked for: not rank 0
  // A sharded store's shards may be restored by another worker's recovery
  // between this registration and the pull of its version (ABORTED, or
  // UNAVAILABLE while that shard restarts): register again, a bounded
  // number of times.
  constexpr int kMaxRegistrations = 20;
  for (int attempt = 1;; ++attempt) {
    absl::StatusOr<ParameterStore::Registration> registration =
        store_->Reconnect(replicas_[0]->parameters(), proposed);
    if (!registration.ok()) {
      // Both: what was lost, and why it could not be found again.
      return absl::Status(registration.status().code(),
                          absl::StrCat(registration.status().message(), " (after: ",
                                       cause.message(), ")"));
    }
    registration_ = *std::move(registration);
    PS_RETURN_IF_ERROR(CheckStoreAppliesTheUpdate(registration_));
    if (registration_.num_workers != num_workers || registration_.rank != rank) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the parameter server came back with this worker as rank ", registration_.rank, " of ",
          registration_.num_workers, " workers; it was rank ", rank, " of ", num_workers, " (",
          cause.message(), ")"));
    }
    const absl::Status started = StartFrom(registration_.version);
    if (started.ok()) return registration_.version;
    if (!IsServerLost(started) || attempt == kMaxRegistrations || StopAsked()) return started;
  }
}

int64_t Trainer::steps_per_epoch() const {
  return (train_->size() + options_.batch_size - 1) / options_.batch_size;
}

absl::Status Trainer::StageBatch(Replica& r, const data::Dataset& data,
                                 absl::Span<const int64_t> indices) const {
  const int64_t n = static_cast<int64_t>(indices.size());
  const int64_t image_elements = n * NumElements(data.sample_shape);
  if (r.device->is_host_memory()) {
    // Device memory is host memory: gather straight into the input tensors.
    return data::GatherBatch(data, indices, options_.normalization,
                             absl::MakeSpan(r.inputs.mutable_data<float>(), image_elements),
                             absl::MakeSpan(r.labels.mutable_data<int32_t>(), n));
  }
  PS_RETURN_IF_ERROR(data::GatherBatch(data, indices, options_.normalization,
                                       absl::MakeSpan(r.host_inputs, image_elements),
                                       absl::MakeSpan(r.host_labels, n)));
  PS_RETURN_IF_ERROR(r.device->CopyHostToDevice(r.inputs.mutable_raw_data(), r.host_inputs,
                                                image_elements * sizeof(float), CopyKind::kData));
  return r.device->CopyHostToDevice(r.labels.mutable_raw_data(), r.host_labels,
                                    n * sizeof(int32_t), CopyKind::kData);
}

absl::StatusOr<std::pair<Tensor, Tensor>> Trainer::StagedViews(const Replica& r, int64_t n) {
  Shape shape = r.inputs.shape();
  shape[0] = n;
  PS_ASSIGN_OR_RETURN(Tensor inputs, r.inputs.View(0, shape));
  PS_ASSIGN_OR_RETURN(Tensor labels, r.labels.View(0, {n}));
  return std::make_pair(std::move(inputs), std::move(labels));
}

int64_t Trainer::GlobalBatchSize(int64_t step) const {
  return std::min<int64_t>(options_.batch_size, train_->size() - step * options_.batch_size);
}

Part Trainer::WorkerPart(int64_t step) const {
  // This worker's index among the step's members, of as many parts.
  if (members_.empty()) {
    return SplitEvenly(GlobalBatchSize(step), registration_.num_workers, registration_.rank);
  }
  const int part = static_cast<int>(
      std::find(members_.begin(), members_.end(), registration_.rank) - members_.begin());
  return SplitEvenly(GlobalBatchSize(step), static_cast<int>(members_.size()), part);
}

absl::Status Trainer::LoadShards(int64_t epoch, int64_t step, std::vector<int64_t>* shard_sizes) {
  if (order_epoch_ != epoch) {
    order_ = data::EpochOrder(train_->size(), options_.seed, epoch, options_.shuffle);
    order_epoch_ = epoch;
  }
  const int64_t batch_begin = step * options_.batch_size;
  const Part worker = WorkerPart(step);
  shard_sizes->assign(devices_.size(), 0);
  for (size_t d = 0; d < devices_.size(); ++d) {
    const Part shard = SplitEvenly(worker.size, static_cast<int>(devices_.size()),
                                   static_cast<int>(d));
    (*shard_sizes)[d] = shard.size;
    if (shard.size == 0) continue;
    absl::Span<const int64_t> indices(order_.data() + batch_begin + worker.begin + shard.begin,
                                      shard.size);
    PS_RETURN_IF_ERROR(StageBatch(*replica_state_[d], *train_, indices));
  }
  return absl::OkStatus();
}

// Replica 0's hooks while the trainer overlaps communication with compute
// (ReplicaOverlap's or DeviceOverlap's), timing its waits: where a
// layer's forward has to block for its parameters, a kWait phase on the
// trainer lane. (Replica 0's pass runs on the trainer's thread, or on
// device thread 0 while the trainer's waits for it: one thread at a time
// moves the phases.)
class Trainer::WaitTimingHooks final : public model::ParameterHooks {
 public:
  WaitTimingHooks(model::ParameterHooks* inner, const PushPullScheduler* scheduler,
                  StepPhases* phases)
      : inner_(inner), scheduler_(scheduler), phases_(phases) {}

  absl::Status BeforeForward(int64_t begin, int64_t end) override {
    if (scheduler_->HasParameters(begin, end)) return inner_->BeforeForward(begin, end);
    phases_->Begin(EventKind::kWait);
    absl::Status status = inner_->BeforeForward(begin, end);
    phases_->Begin(EventKind::kCompute);
    return status;
  }
  void GradientsReady(int64_t begin, int64_t end) override { inner_->GradientsReady(begin, end); }
  void AfterBackward(int64_t begin, int64_t end) override { inner_->AfterBackward(begin, end); }

 private:
  model::ParameterHooks* const inner_;
  const PushPullScheduler* const scheduler_;
  StepPhases* const phases_;
};

std::vector<int64_t> Trainer::ShardSizes(int64_t step) const {
  const Part worker = WorkerPart(step);
  std::vector<int64_t> sizes(devices_.size());
  for (size_t d = 0; d < devices_.size(); ++d) {
    sizes[d] = SplitEvenly(worker.size, static_cast<int>(devices_.size()), static_cast<int>(d)).size;
  }
  return sizes;
}

absl::StatusOr<std::vector<DeviceShard>> Trainer::DeviceShards(const std::vector<int64_t>& sizes,
                                                               bool staged) const {
  std::vector<DeviceShard> shards(devices_.size());
  for (size_t d = 0; d < devices_.size(); ++d) {
    DeviceShard& shard = shards[d];
    shard.device = devices_[d];
    shard.model = replicas_[d].get();
    shard.size = sizes[d];
    shard.metrics = &replica_state_[d]->metrics;
    if (!staged || shard.size == 0) continue;
    PS_ASSIGN_OR_RETURN(std::tie(shard.inputs, shard.labels),
                        StagedViews(*replica_state_[d], shard.size));
  }
  return shards;
}

absl::StatusOr<std::vector<DeviceShard>> Trainer::StageCalibrationBatch(int64_t pass) {
  std::vector<int64_t> sizes;
  PS_RETURN_IF_ERROR(LoadShards(0, pass % steps_per_epoch(), &sizes));
  for (int64_t& size : sizes) size = std::max<int64_t>(1, size);  // a pass needs a sample
  PS_ASSIGN_OR_RETURN(std::vector<DeviceShard> shards, DeviceShards(sizes, /*staged=*/true));
  for (DeviceShard& shard : shards) shard.metrics = nullptr;  // timed, not trained
  return shards;
}

absl::StatusOr<ComputeStep> Trainer::NewComputeStep(
    int64_t iteration, const std::vector<int64_t>& shard_sizes,
    std::vector<model::ParameterHooks*> overlap) {
  ComputeStep step;
  step.iteration = iteration;
  PS_ASSIGN_OR_RETURN(step.shards, DeviceShards(shard_sizes, compute_->reads_data()));
  step.device_threads = device_threads_.get();
  step.observer = options_.observer;
  if (!overlap.empty()) {
    step.overlap = std::move(overlap);
    step.await_all_parameters = [this] { return scheduler_->AwaitAll(); };
  }
  return step;
}

absl::Status Trainer::CheckExchange() const {
  if (scheduler_ != nullptr) return absl::OkStatus();
  return absl::FailedPreconditionError(
      "no parameter exchange: the trainer is not initialised, or its last recovery failed");
}

// One overlapping step's hooks: replica 0's timed, over a DeviceOverlap's
// or this step's ReplicaOverlap's.
struct Trainer::OverlapStep {
  std::optional<ReplicaOverlap> replicas;
  std::optional<WaitTimingHooks> timed;
  std::vector<model::ParameterHooks*> hooks;  // per device
};

absl::Status Trainer::BeginOverlap(const std::vector<int64_t>& shard_sizes, StepPhases* phases,
                                   OverlapStep* step) {
  if (device_overlap_ != nullptr) {
    PS_RETURN_IF_ERROR(device_overlap_->BeginStep(scheduler_.get()));
    step->timed.emplace(device_overlap_->hooks(), scheduler_.get(), phases);
    step->hooks.push_back(&*step->timed);
    return absl::OkStatus();
  }
  std::vector<float*> gradients, parameters;
  std::vector<bool> computing;
  for (size_t d = 0; d < replicas_.size(); ++d) {
    gradients.push_back(replicas_[d]->flat_gradients().mutable_data<float>());
    parameters.push_back(replicas_[d]->flat_parameters().mutable_data<float>());
    computing.push_back(shard_sizes[d] > 0);
  }
  step->replicas.emplace(scheduler_.get(), std::move(gradients), std::move(parameters),
                         num_parameters_);
  PS_RETURN_IF_ERROR(step->replicas->BeginStep(computing));
  step->timed.emplace(step->replicas->hooks(0), scheduler_.get(), phases);
  step->hooks.push_back(&*step->timed);
  for (size_t d = 1; d < replicas_.size(); ++d) step->hooks.push_back(step->replicas->hooks(d));
  return absl::OkStatus();
}

absl::Status Trainer::FinishOverlap(OverlapStep& step) {
  // Whatever the layers did not hand over (none have parameters outside a
  // layer today, but the scheduler must see every bucket pushed).
  if (device_overlap_ != nullptr) return device_overlap_->FinishStep();
  step.replicas->FinishStep();
  return absl::OkStatus();
}

absl::Status Trainer::TrainStep(int64_t epoch, int64_t step) {
  PS_RETURN_IF_ERROR(CheckExchange());
  const int64_t iteration = epoch * steps_per_epoch() + step;
  if (registration_.dynamic_members) {
    // The step's members, announced with the previous step's first push
    // reply (or the registration): they decide this worker's part.
    PS_ASSIGN_OR_RETURN(members_, store_->Members(iteration, registration_.num_workers));
    if (std::find(members_.begin(), members_.end(), registration_.rank) == members_.end()) {
      return absl::AbortedError(absl::StrCat("worker rank ", registration_.rank,
                                             " is no member of iteration ", iteration,
                                             " (dropped from the job): register again"));
    }
  }
  StepPhases phases(&phase_observers_, clock_, iteration);
  last_iteration_ = iteration;

  // 1. This worker's shards.
  phases.Begin(EventKind::kData);
  std::vector<int64_t> shard_sizes;
  if (compute_->reads_data()) {
    PS_RETURN_IF_ERROR(LoadShards(epoch, step, &shard_sizes));
  } else {
    shard_sizes = ShardSizes(step);  // only the sizes: nothing reads the samples
  }
  int64_t samples = 0;
  for (int64_t s : shard_sizes) samples += s;
  PS_RETURN_IF_ERROR(scheduler_->BeginIteration(samples));

  // 2. Forward/backward (or what the compute mode does instead), of the
  // loss times the step's scale.
  if (loss_scaling_) {
    const float scale = store_->LossScale();
    if (!(scale > 0)) {
      // The server divides every update by its scale: training on without
      // multiplying by it would shrink every step silently.
      return absl::FailedPreconditionError(
          "the server scales the loss but the parameter store reports no scale");
    }
    for (auto& m : replicas_) m->set_loss_scale(scale);
  }
  // Overlapping, each replica's forward waits layer by layer for the
  // previous iteration's pulls, and backward pushes region by region.
  phases.Begin(EventKind::kCompute);
  OverlapStep overlap;
  if (overlapping_) PS_RETURN_IF_ERROR(BeginOverlap(shard_sizes, &phases, &overlap));
  PS_ASSIGN_OR_RETURN(ComputeStep compute,
                      NewComputeStep(iteration, shard_sizes, overlap.hooks));
  PS_RETURN_IF_ERROR(compute_->Compute(compute));
  if (overlapping_) {
    PS_RETURN_IF_ERROR(FinishOverlap(overlap));
    phases.End();
    return absl::OkStatus();
  }

  // 3. Sum the gradients on the devices into device 0.
  phases.Begin(EventKind::kReduce);
  std::vector<Tensor*> grads;
  for (auto& m : replicas_) grads.push_back(&m->flat_gradients());
  PS_RETURN_IF_ERROR(collective_->ReduceSumToRoot(grads));
  PS_RETURN_IF_ERROR(devices_[0]->Synchronize());

  // 4. One copy to host (none from a CPU device), then push every bucket,
  // front first; each bucket's pull starts as soon as its push is accepted.
  const int64_t bytes = num_parameters_ * static_cast<int64_t>(sizeof(float));
  if (host_gradients_ != nullptr) {
    phases.Begin(EventKind::kCopyToHost, bytes);
    PS_RETURN_IF_ERROR(devices_[0]->CopyDeviceToHost(
        host_gradients_, replicas_[0]->flat_gradients().raw_data(), bytes, CopyKind::kModel));
  }
  if (loss_scaling_) PoisonOverflow(iteration);
  phases.Begin(EventKind::kPush, bytes);
  scheduler_->GradientsReadyFrom(0);
  PS_RETURN_IF_ERROR(scheduler_->AwaitPushes());

  // 5. The pulls: each is held by the store until every worker has pushed
  // its bucket, so this includes waiting for the slowest worker.
  phases.Begin(EventKind::kPull, bytes);
  PS_RETURN_IF_ERROR(scheduler_->AwaitAll());

  // 6. One copy to device 0 (none to a CPU device), broadcast to the rest.
  phases.Begin(EventKind::kCopyToDevice, bytes);
  PS_RETURN_IF_ERROR(LoadPulledParameters());
  phases.End();
  return absl::OkStatus();
}

void Trainer::PoisonOverflow(int64_t iteration) {
  // The push buffer is host memory (pinned, or a CPU device's own).
  float* gradients = const_cast<float*>(wire_gradients_.data());
  if (iteration == options_.inject_overflow_at_iteration && num_parameters_ > 0) {
    gradients[0] = std::numeric_limits<float>::infinity();
  }
  const absl::string_view bytes(reinterpret_cast<const char*>(gradients),
                                num_parameters_ * static_cast<int64_t>(sizeof(float)));
  float bad = 0.f;
  if (FirstNonFinite({&bytes, 1}, &bad) < 0) return;
  ++overflow_steps_;
  std::fill(gradients, gradients + num_parameters_, std::numeric_limits<float>::quiet_NaN());
}

absl::Status Trainer::FinishCommunication() {
  PS_RETURN_IF_ERROR(CheckExchange());
  if (!overlapping_) return scheduler_->AwaitAll();
  // The last step's pulls, still in flight: time the step waits for.
  StepPhases phases(&phase_observers_, clock_, last_iteration_);
  phases.Begin(EventKind::kWait);
  PS_RETURN_IF_ERROR(scheduler_->AwaitAll());
  // Overlapping, a device whose memory is not host memory, or a replica
  // other than 0, copies a layer's parameters before its forward: here each
  // gets all of them, so every replica holds the update.
  PS_RETURN_IF_ERROR(LoadPulledParameters());
  phases.End();
  return absl::OkStatus();
}

absl::Status Trainer::ReadAndResetMetrics(double* loss_sum, double* correct) {
  *loss_sum = 0;
  *correct = 0;
  for (auto& r : replica_state_) {
    float host[2];
    PS_RETURN_IF_ERROR(r->device->Synchronize());
    PS_RETURN_IF_ERROR(r->device->CopyDeviceToHost(host, r->metrics.raw_data(), sizeof(host),
                                                   CopyKind::kOther));
    *loss_sum += host[0];
    *correct += host[1];
    PS_RETURN_IF_ERROR(r->metrics.SetZero());
  }
  return absl::OkStatus();
}

absl::Status Trainer::Evaluate(const data::Dataset& dataset, double* loss, double* accuracy) {
  Replica& r = *replica_state_[0];
  model::Model& model = *replicas_[0];
  model.set_step(-1);  // its layer events belong to no training step
  // Keep the training accumulators apart from the evaluation ones.
  PS_ASSIGN_OR_RETURN(Tensor acc, Tensor::Zeros(r.device, {2}));
  const int64_t batch = std::min(options_.eval_batch_size, r.capacity);
  std::vector<int64_t> indices;
  for (int64_t begin = 0; begin < dataset.size(); begin += batch) {
    const int64_t n = std::min(batch, dataset.size() - begin);
    indices.resize(n);
    for (int64_t i = 0; i < n; ++i) indices[i] = begin + i;
    PS_RETURN_IF_ERROR(StageBatch(r, dataset, indices));
    PS_ASSIGN_OR_RETURN(auto views, StagedViews(r, n));
    PS_ASSIGN_OR_RETURN(model::DeviceMetrics metrics, model.Evaluate(views.first, views.second));
    PS_RETURN_IF_ERROR(AccumulateMetrics(*r.device, metrics, acc));
  }
  float host[2];
  PS_RETURN_IF_ERROR(r.device->Synchronize());
  PS_RETURN_IF_ERROR(r.device->CopyDeviceToHost(host, acc.raw_data(), sizeof(host), CopyKind::kOther));
  *loss = host[0] / std::max<int64_t>(1, dataset.size());
  *accuracy = host[1] / std::max<int64_t>(1, dataset.size());
  return absl::OkStatus();
}

// Run's bookkeeping from step to step.
struct Trainer::RunState {
  TrainingReport report;
  int64_t end = 0;        // the global iteration Run stops before
  int64_t iteration = 0;  // the next global iteration to train
  int64_t total_steps = 0;
  // The epochs after the first (all, when there is one): the throughput.
  double later_samples = 0, later_seconds = 0, later_global_samples = 0;
  // The epoch in progress.
  EpochStats stats;
  int64_t global_samples = 0;
  int64_t start_ns = 0;
};

TrainingReport Trainer::NewReport() const {
  TrainingReport report;
  report.model = replicas_[0]->config().name;
  for (Device* d : devices_) report.devices.push_back(d->name());
  report.rank = registration_.rank;
  report.num_workers = registration_.num_workers;
  report.global_batch_size = options_.batch_size;
  report.model_parameters = num_parameters_;
  report.compute = compute_->Name();
  if (const ComputeProfile* replayed = compute_->replay_profile(); replayed != nullptr) {
    report.replay_step_seconds = static_cast<double>(replayed->step_ns()) / 1e9;
  }
  return report;
}

void Trainer::BeginEpoch(RunState& run) {
  run.stats = EpochStats();
  run.stats.epoch = run.iteration / steps_per_epoch() + 1;
  run.global_samples = 0;
  split_observer_.Reset();
  run.start_ns = clock_->NowNanos();
}

bool Trainer::StopAsked() const { return options_.should_stop && options_.should_stop(); }

absl::Status Trainer::StoppedWithoutServer(int64_t step, const absl::Status& lost) {
  return absl::CancelledError(
      absl::StrCat("asked to stop; step ", step, " did not complete: ", lost.message()));
}

absl::Status Trainer::ResumeAfterLoss(RunState& run, const absl::Status& status) {
  if (!options_.recover_from_server_loss || !IsServerLost(status)) return status;
  if (StopAsked()) return StoppedWithoutServer(run.iteration, status);
  // The server went away or restarted: register again and resume from
  // its version, which may be older (a checkpoint). The epoch resumed
  // into counts the steps trained since; an epoch reported already and
  // rolled back into is reported again when it ends.
  const int64_t recover_start_ns = clock_->NowNanos();
  TrainingReport::Recovery recovery;
  recovery.failed_iteration = run.iteration;
  recovery.error = std::string(status.message());
  PS_ASSIGN_OR_RETURN(const int64_t resume, Recover(status));
  recovery.resumed_version = resume;
  recovery.seconds = SecondsSince(*clock_, recover_start_ns);
  run.report.recoveries.push_back(recovery);
  if (on_recovery_) on_recovery_(recovery);
  // Asynchronous: the server's version counts every worker's updates,
  // not this worker's steps; it goes on from its own step.
  if (!registration_.consistency.independent_steps()) run.iteration = resume;
  const int64_t steps_per_epoch = this->steps_per_epoch();
  while (!run.report.epochs.empty() &&
         run.report.epochs.back().epoch > run.iteration / steps_per_epoch) {
    run.report.epochs.pop_back();
  }
  double loss_sum, correct;
  PS_RETURN_IF_ERROR(ReadAndResetMetrics(&loss_sum, &correct));
  if (run.iteration < run.end) BeginEpoch(run);
  return absl::OkStatus();
}

void Trainer::CountStep(RunState& run) {
  const int64_t steps_per_epoch = this->steps_per_epoch();
  const int64_t iteration = run.iteration;
  const int64_t step = iteration % steps_per_epoch;
  if (!members_.empty() && static_cast<int>(members_.size()) < registration_.num_workers) {
    // A step with fewer workers: extend the last range or start one.
    std::vector<std::pair<int64_t, int64_t>>& shrunk = run.report.shrunk_steps;
    if (!shrunk.empty() && shrunk.back().second + 1 == iteration) {
      shrunk.back().second = iteration;
    } else {
      shrunk.push_back({iteration, iteration});
    }
  }
  ++run.total_steps;
  ++run.stats.steps;
  run.stats.samples += WorkerPart(step).size;
  run.global_samples += GlobalBatchSize(step);
  if (on_step_) {
    StepProgress p;
    p.epoch = iteration / steps_per_epoch + 1;
    p.step_in_epoch = step + 1;
    p.steps_in_epoch = steps_per_epoch;
    p.samples = run.stats.samples;
    p.seconds = SecondsSince(*clock_, run.start_ns);
    on_step_(p);
  }
}

absl::Status Trainer::EndEpoch(RunState& run, int64_t epoch) {
  EpochStats& stats = run.stats;
  stats.train_seconds = SecondsSince(*clock_, run.start_ns);
  stats.split = split_observer_.split();
  AddSplit(&run.report.split, stats.split);
  double loss_sum, correct;
  PS_RETURN_IF_ERROR(ReadAndResetMetrics(&loss_sum, &correct));
  stats.train_loss = loss_sum / std::max<int64_t>(1, stats.samples);
  stats.train_accuracy = correct / std::max<int64_t>(1, stats.samples);
  stats.samples_per_second = stats.samples / std::max(1e-9, stats.train_seconds);
  if (epoch > 0 || options_.epochs == 1) {
    run.later_samples += stats.samples;
    run.later_global_samples += run.global_samples;
    run.later_seconds += stats.train_seconds;
  }
  if (options_.evaluate && test_ != nullptr && test_->size() > 0) {
    PS_RETURN_IF_ERROR(Evaluate(*test_, &stats.test_loss, &stats.test_accuracy));
  }
  if (options_.evaluate && validation_ != nullptr && validation_->size() > 0) {
    PS_RETURN_IF_ERROR(
        Evaluate(*validation_, &stats.validation_loss, &stats.validation_accuracy));
  }
  run.report.epochs.push_back(stats);
  if (on_epoch_) on_epoch_(stats);
  return absl::OkStatus();
}

void Trainer::FinishReport(RunState& run) const {
  TrainingReport& report = run.report;
  if (run.later_seconds == 0 && !report.epochs.empty()) {  // stopped inside epoch 1
    run.later_samples = report.epochs[0].samples;
    run.later_global_samples =
        static_cast<double>(report.epochs[0].samples) * registration_.num_workers;
    run.later_seconds = report.epochs[0].train_seconds;
  }
  report.steps = run.total_steps;
  if (!report.epochs.empty()) {
    report.final_train_loss = report.epochs.back().train_loss;
    report.final_test_accuracy = report.epochs.back().test_accuracy;
  }
  report.samples_per_second = run.later_samples / std::max(1e-9, run.later_seconds);
  report.global_samples_per_second = run.later_global_samples / std::max(1e-9, run.later_seconds);
  int64_t to_host = 0, to_device = 0;
  for (Device* d : devices_) {
    to_host += d->counters().device_to_host(CopyKind::kModel);
    to_device += d->counters().host_to_device(CopyKind::kModel);
  }
  if (run.total_steps > 0) {
    report.model_bytes_to_host_per_step = static_cast<double>(to_host) / run.total_steps;
    report.model_bytes_to_device_per_step = static_cast<double>(to_device) / run.total_steps;
  }
}

absl::StatusOr<TrainingReport> Trainer::Run() {
  RunState run;
  run.report = NewReport();
  for (auto& r : replica_state_) PS_RETURN_IF_ERROR(r->metrics.SetZero());
  for (Device* d : devices_) d->ResetCounters();
  const int64_t steps_per_epoch = this->steps_per_epoch();
  run.end = options_.epochs * steps_per_epoch;
  if (options_.max_steps > 0) run.end = std::min(run.end, options_.max_steps);
  // The loop runs over global iterations, from the version the store gave
  // (0 for a new job; later for a server resumed from a checkpoint or a
  // worker rejoining): the data of iteration t is a function of the seed
  // and t, so any worker can start, or start again, anywhere.
  // Asynchronous: the server's version counts every worker's updates; this
  // worker runs its own steps.
  run.iteration = registration_.consistency.independent_steps() ? 0 : registration_.version;
  if (run.iteration < run.end) BeginEpoch(run);
  while (run.iteration < run.end) {
    const int64_t epoch = run.iteration / steps_per_epoch;
    const int64_t step = run.iteration % steps_per_epoch;
    absl::Status status = TrainStep(epoch, step);
    // The last step of the epoch: its parameters must be in before the
    // epoch ends (evaluation, weights, the next epoch's stats).
    if (status.ok() && (step + 1 == steps_per_epoch || run.iteration + 1 == run.end)) {
      status = FinishCommunication();
      if (status.ok() && registration_.consistency.stale_pulls()) {
        status = CatchUp(run.iteration + 1);
      }
    }
    if (!status.ok()) {
      PS_RETURN_IF_ERROR(ResumeAfterLoss(run, status));
      continue;
    }
    CountStep(run);
    ++run.iteration;
    const bool stop = StopAsked() && run.iteration != run.end;
    if (stop) {
      // Its pulls in: the replicas hold the version the step produced.
      if (absl::Status finished = FinishCommunication(); !finished.ok()) {
        if (!IsServerLost(finished)) return finished;
        return StoppedWithoutServer(run.iteration - 1, finished);
      }
      run.report.stopped_at_step = run.iteration - 1;
    }
    if (!stop && step + 1 != steps_per_epoch && run.iteration != run.end) continue;
    // The epoch ends (or training does).
    PS_RETURN_IF_ERROR(EndEpoch(run, epoch));
    if (stop) break;
    if (run.iteration < run.end) BeginEpoch(run);
  }
  FinishReport(run);
  return std::move(run.report);
}

}  // namespace ps::worker
