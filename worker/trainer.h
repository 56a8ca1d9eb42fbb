#ifndef PS_WORKER_TRAINER_H_
#define PS_WORKER_TRAINER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/device.h"
#include "common/timed_event.h"
#include "worker/collective.h"
#include "worker/compute_mode.h"
#include "worker/device_threads.h"
#include "worker/data/dataset.h"
#include "worker/data/loader.h"
#include "common/precision.h"
#include "worker/model/model.h"
#include "worker/parameter_store.h"
#include "worker/push_pull_scheduler.h"
#include "worker/split_batch.h"
#include "worker/time_split.h"
#include "worker/training_report.h"

namespace ps::worker {

class DeviceOverlap;

struct TrainerOptions {
  // The global batch: all workers and all their devices together. Global
  // batch t of an epoch's order is cut into num_workers contiguous parts (part
  // r for rank r) and each part into one shard per device, so any W x D split
  // sees exactly the batches one device with this batch size would see.
  int64_t batch_size = 256;
  int64_t epochs = 10;
  int64_t max_steps = 0;  // stop after this many steps in all (0: no limit)
  uint64_t seed = 0;      // data order
  bool shuffle = true;
  data::Normalization normalization;
  bool evaluate = true;  // test-set evaluation after each epoch (device 0)
  int64_t eval_batch_size = 1000;
  // A safetensors file to start from instead of the seeded initialisation
  // (its parameters are proposed to the store; its buffers go to every
  // replica). Empty: Model::Initialize(seed).
  std::string init_weights;

  // The precision of every device's matrix multiplies (common/precision.h):
  // fp32, or bf16/fp16 operands with fp32 accumulation (linear layers and
  // convolutions); everything else, and the parameters and gradients the
  // store sees, stays fp32. Init sets it on each device.
  Precision precision = Precision::kFp32;
  // For tests of loss scaling: at this global iteration this worker's
  // gradient gets an infinity, as an fp16 overflow would make (-1: never).
  int64_t inject_overflow_at_iteration = -1;

  // Communication overlaps compute: each layer's gradients are pushed as
  // backward produces them, and the next step's forward of a layer waits
  // only for that layer's new parameters. Takes effect with no loss
  // scaling and either CPU devices (one or several:
  // worker/replica_overlap.h sums each region of the replicas' gradients as
  // soon as every replica has it) or one device whose memory is not host
  // memory (a CUDA device: worker/device_overlap.h copies each region of
  // its gradients to the host once backward has issued it, and each layer's
  // parameters to it before its forward). Several CUDA devices push and
  // pull bucket by bucket after the whole backward and reduction, without
  // overlapping compute; so does loss scaling, since an overflow anywhere
  // must reach every chunk. The parameters are bit-identical either way.
  bool overlap = true;
  // Buckets and bytes in flight of the push/pull scheduler.
  PushPullOptions push_pull;

  // How a step's gradients are computed (worker/compute_mode.h's
  // ComputeModeOptions says what each field does; MakeComputeMode refuses a
  // bad value or combination with kInvalidArgument). Real compute, or its
  // replay for experiments with more emulated hosts than the machine has
  // cores: Create then times replay_calibration_steps real passes (run it
  // while the other workers wait, to measure it alone) and every step sleeps
  // through their average instead; no data is read, the loss and accuracy
  // read 0, and one device only.
  bool replay_compute = false;
  int64_t replay_calibration_steps = 5;
  double replay_step_seconds = 0;  // > 0: the replayed pass scaled to this
  // An emulated slower host: each step's compute takes `slowdown` (>= 1)
  // times as long; slowdown_period P > 0 slows alternate blocks of P steps
  // only, rank r's blocks offset by r (0: every step).
  double slowdown = 1;
  int64_t slowdown_period = 0;

  // When a step fails because the store lost its server (IsServerLost: it
  // went away, shut down or restarted), Run reconnects (the store waits
  // within its bounds), rolls back to the version the server has (a
  // checkpoint's, perhaps older than this worker's), and trains on from
  // there: the data of a step is a function of the seed and the step, so
  // with the server's deterministic sums the parameters end bit for bit as
  // without the loss. Each recovery is in the report. False: the error
  // ends Run.
  bool recover_from_server_loss = true;

  // Asked after every step (and its communication) has finished: true ends
  // Run there, cleanly (the report says at which step: stopped_at_step).
  // For SIGTERM: the step in progress finishes, nothing is left half-pushed.
  // Once it is true, a lost server is not waited for: Run ends with
  // kCancelled saying which step did not complete. Empty: never.
  std::function<bool()> should_stop;

  // Receives every timed event of the training steps (common/timed_event.h),
  // each with step = the global iteration (epoch * steps_per_epoch() + the
  // batch's index in the epoch):
  //   - the step's phases on kTrainerLane, back to back (one phase ends at
  //     the clock reading the next starts at). Without overlap, once each in
  //     this order: kData, kCompute, kReduce, kCopyToHost (not for a CPU
  //     device 0: pushes read its memory), kPush (until every bucket's push
  //     is accepted), kPull (until every bucket's new parameters are in,
  //     waiting for the other workers included: the store holds a pull
  //     until its bucket's version exists), kCopyToDevice (the broadcast,
  //     and before it the copy from host to a non-CPU device 0). With
  //     overlap: kData, then kCompute interrupted by a kWait wherever the
  //     forward blocks for a layer's parameters (exposed communication);
  //     FinishCommunication adds a kWait of the last step. bytes is the
  //     model's gradient or parameter bytes for kCopyToHost, kPush, kPull
  //     and kCopyToDevice, 0 otherwise. A phase cut short by an error is not
  //     reported.
  //   - kCompute on DeviceLane(d) for device d's forward/backward (one per
  //     device per step, also for an empty shard), inside the trainer lane's
  //     kCompute;
  //   - kForward and kBackward on DeviceLane(d) for each layer of device d's
  //     replica, named after the layer (Model::set_observer).
  // Called from the trainer's thread and the device threads, concurrently.
  // On CUDA devices kernels run asynchronously and the timestamps are host
  // times: a layer's events and device events with one device span the
  // enqueueing of its work, not its execution. The trainer lane's phases and,
  // with several devices, the per-device compute events end after the
  // devices have synchronised, so they are device time. Null: no events (the
  // time split is kept regardless). Must outlive the trainer.
  EventObserver* observer = nullptr;
  // What the events, the time split and the epochs' train_seconds are
  // measured on. Never null (kInvalidArgument); must outlive the trainer.
  const Clock* clock = Clock::Real();
};

// Progress during an epoch: called after every step on the training thread.
struct StepProgress {
  int64_t epoch = 0;  // 1-based
  int64_t step_in_epoch = 0;  // 1-based
  int64_t steps_in_epoch = 0;
  int64_t samples = 0;  // this epoch so far
  double seconds = 0;   // this epoch so far
};

// Data-parallel training on one worker's devices, talking to a parameter
// store through a PushPullScheduler (buckets of store segments, pushed and
// pulled front first within a bound of bytes in flight). One replica of the
// model per device; each step:
//   1. gather this worker's part of the global batch, one shard per device
//   2. forward/backward on every device concurrently, each on its device's
//      thread (summed loss): the compute mode's work (worker/compute_mode.h;
//      or its replay, or either slowed down)
//   3. sum the replicas' gradients on the devices (DeviceCollective)
//   4. copy the sum to host memory once (a CPU device 0's memory is host
//      memory: no copy) and push it, bucket by bucket
//   5. pull each bucket's new parameters as soon as its push is accepted
//   6. copy them to device 0 once (none for a CPU device) and broadcast
// Overlapping (TrainerOptions::overlap: CPU devices, or one CUDA device), 3
// and 4 run region by region inside backward, as soon as every replica has
// a region's gradients (on a CUDA device: as soon as each region's copy to
// the host lands), 5 completes in the background until the next step's
// forward needs each layer, and 6 is each replica's copy of a layer's
// parameters before its forward.
// With one device and a LocalParameterStore this is plain minibatch SGD.
// The trainer owns one long-lived host thread per device (none with one
// device: its work runs on the calling thread).
//
// Not thread-safe: one thread calls Run, TrainStep and Evaluate.
class Trainer {
 public:
  // The devices, datasets and store must outlive the trainer. `test` and
  // `validation` (a hold-out of the training set, data::SplitHoldout) may be
  // null; with evaluate, each is evaluated after every epoch. Registers with
  // the store and loads the parameters it returns. kFailedPrecondition,
  // before any step, for a store whose versions are not parameters (a
  // sum-only server, --optimizer=none: this trainer applies no optimizer of
  // its own).
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const TrainerOptions& options,
                                                         const model::ModelConfig& model,
                                                         std::vector<Device*> devices,
                                                         ParameterStore* store,
                                                         const data::Dataset* train,
                                                         const data::Dataset* test,
                                                         const data::Dataset* validation = nullptr);
  ~Trainer();

  // Called with each finished epoch, and after each step.
  void set_epoch_callback(std::function<void(const EpochStats&)> fn) { on_epoch_ = std::move(fn); }
  void set_step_callback(std::function<void(const StepProgress&)> fn) { on_step_ = std::move(fn); }
  // Called after each recovery from a lost server (recover_from_server_loss).
  void set_recovery_callback(std::function<void(const TrainingReport::Recovery&)> fn) {
    on_recovery_ = std::move(fn);
  }

  absl::StatusOr<TrainingReport> Run();

  // Runs one step on global batch `step` of epoch `epoch`'s order; public for
  // tests that compare single steps across configurations. Overlapping, the
  // step's pulls may still be in flight when it returns: call
  // FinishCommunication before reading the parameters.
  absl::Status TrainStep(int64_t epoch, int64_t step);
  // Blocks until every replica holds the parameters of the last step's
  // update (or returns the communication's first error). Run calls it at the
  // end of every epoch.
  absl::Status FinishCommunication();

  // Time spent in each phase by TrainStep since the last reset (Run resets
  // it every epoch): the trainer lane's events, summed by a TimeSplitObserver.
  TimeSplit time_split() const { return split_observer_.split(); }
  void ResetTimeSplit() { split_observer_.Reset(); }

  // Loss and accuracy on `dataset` in inference mode, on device 0.
  absl::Status Evaluate(const data::Dataset& dataset, double* loss, double* accuracy);

  // Replica 0 (after a step and FinishCommunication its parameters equal
  // every replica's). Its
  // batch-norm running statistics are device 0's own, which is what
  // evaluation uses and what SaveWeights writes.
  model::Model& model() { return *replicas_[0]; }
  int64_t steps_per_epoch() const;
  const ParameterStore::Registration& registration() const { return registration_; }
  // Loss scaling: the steps whose gradient overflowed on this worker (each
  // skipped by every worker).
  int64_t overflow_steps() const { return overflow_steps_; }
  // The pass replayed (replay_compute); null otherwise.
  const ComputeProfile* replay_profile() const { return compute_->replay_profile(); }

 private:
  struct Replica;
  class StepPhases;
  class WaitTimingHooks;
  Trainer(const TrainerOptions& options, std::unique_ptr<ComputeMode> compute,
          std::vector<Device*> devices, ParameterStore* store, const data::Dataset* train,
          const data::Dataset* test);

  absl::Status Init(const model::ModelConfig& model);
  // Init's steps, in order. The device threads, the collective and one
  // replica per device, initialised from options_.seed or init_weights.
  absl::Status CreateReplicas(const model::ModelConfig& model);
  // Once registered (the split of the global batch known): each device's
  // input, label and metric tensors, and its pinned staging buffers.
  absl::Status CreateReplicaState();
  // wire_gradients_ / wire_parameters_ (device 0's own memory, or pinned
  // host buffers), offered to the store with BindBuffers.
  absl::Status BindWireBuffers();
  // Pulls exactly `version` into every replica and starts a scheduler that
  // holds it.
  absl::Status StartFrom(int64_t version);
  // The pulled parameters (wire_parameters_) into every replica: one copy
  // to device 0 where its memory is not host memory, then the broadcast to
  // the others.
  absl::Status LoadPulledParameters();
  // kFailedPrecondition when there is no scheduler (a failed Recover or
  // CatchUp leaves none): TrainStep and FinishCommunication refuse then.
  absl::Status CheckExchange() const;
  // Stale synchronous (registration_.consistency.stale_pulls()), at the end of an
  // epoch: waits until every worker's steps up to `version` are applied and
  // starts from it, so the epoch's evaluation and weights see the model
  // sync would (this worker's pulls may have been up to S updates behind).
  absl::Status CatchUp(int64_t version);
  // Reconnects after `cause` (a lost server), and StartFrom the server's
  // version, which it returns.
  absl::StatusOr<int64_t> Recover(const absl::Status& cause);
  // Stages this worker's part of global batch `step` of epoch `epoch`'s
  // order, one shard per device, and returns the shards' sizes.
  absl::Status LoadShards(int64_t epoch, int64_t step, std::vector<int64_t>* shard_sizes);
  // Those sizes alone, for a compute mode that reads no data.
  std::vector<int64_t> ShardSizes(int64_t step) const;
  // Device d's replica and shard of sizes[d] samples, with views of the
  // staged samples when `staged` (none of an empty shard).
  absl::StatusOr<std::vector<DeviceShard>> DeviceShards(const std::vector<int64_t>& sizes,
                                                        bool staged) const;
  // ComputeSetup::stage_batch: batch `pass` of epoch 0's order staged, each
  // shard with at least one sample (an empty one keeps a stale sample).
  absl::StatusOr<std::vector<DeviceShard>> StageCalibrationBatch(int64_t pass);
  // Overlapping, a step's hooks (BeginOverlap, before the passes) and what
  // no hook handed over (FinishOverlap, after them).
  struct OverlapStep;
  absl::Status BeginOverlap(const std::vector<int64_t>& shard_sizes, StepPhases* phases,
                            OverlapStep* step);
  absl::Status FinishOverlap(OverlapStep& step);
  // What compute_ gets for step `iteration`: the shards, and overlapping,
  // each device's hooks and the scheduler's wait for every parameter.
  absl::StatusOr<ComputeStep> NewComputeStep(int64_t iteration,
                                             const std::vector<int64_t>& shard_sizes,
                                             std::vector<model::ParameterHooks*> overlap);
  // The samples of global batch `step` (the last of an epoch may be short),
  // and this worker's part of them.
  int64_t GlobalBatchSize(int64_t step) const;
  Part WorkerPart(int64_t step) const;
  // Gathers samples `indices` of `data` into replica r's input tensors (via
  // its pinned staging buffers when its memory is not host memory).
  absl::Status StageBatch(Replica& r, const data::Dataset& data,
                          absl::Span<const int64_t> indices) const;
  // Views of the first n staged inputs and labels.
  static absl::StatusOr<std::pair<Tensor, Tensor>> StagedViews(const Replica& r, int64_t n);
  absl::Status ReadAndResetMetrics(double* loss_sum, double* correct);

  // Run's steps, around its bookkeeping (RunState, in trainer.cc).
  struct RunState;
  // The report's fields known before the first step.
  TrainingReport NewReport() const;
  // Starts the epoch of run.iteration: its stats, its time split and its
  // clock.
  void BeginEpoch(RunState& run);
  // options_.should_stop says stop.
  bool StopAsked() const;
  // kCancelled: asked to stop when `step` failed for a lost server, which is
  // not waited for.
  static absl::Status StoppedWithoutServer(int64_t step, const absl::Status& lost);
  // After step run.iteration failed with `status`: reconnects and rolls
  // run back to the server's version (recover_from_server_loss and a lost
  // server), or returns the error that ends Run.
  absl::Status ResumeAfterLoss(RunState& run, const absl::Status& status);
  // Counts step run.iteration (done) into the epoch and the report, and
  // tells on_step_.
  void CountStep(RunState& run);
  // Ends `epoch`: its statistics, evaluation, the report and on_epoch_.
  absl::Status EndEpoch(RunState& run, int64_t epoch);
  // The report's totals, once the loop is over.
  void FinishReport(RunState& run) const;

  const TrainerOptions options_;
  // Fills the replicas' gradients each step (real, replayed, slowed down).
  const std::unique_ptr<ComputeMode> compute_;
  std::vector<Device*> devices_;
  ParameterStore* store_;
  const data::Dataset* train_;
  const data::Dataset* test_;
  const data::Dataset* validation_ = nullptr;

  const Clock* const clock_;
  // The trainer lane's phases go to split_observer_ and options_.observer;
  // device-lane events to options_.observer only.
  TimeSplitObserver split_observer_;
  ObserverFanOut phase_observers_;

  std::vector<std::unique_ptr<model::Model>> replicas_;
  std::vector<std::unique_ptr<Replica>> replica_state_;
  // One long-lived thread per device: replica d's forward/backward and the
  // CPU collective's slice d run on thread d. Declared before collective_,
  // which uses it, so it is destroyed after.
  std::unique_ptr<DeviceThreads> device_threads_;
  std::unique_ptr<DeviceCollective> collective_;
  ParameterStore::Registration registration_;
  // Pinned host buffers for the one copy each way per step; null when device
  // 0 is a CPU device (the scheduler reads and writes its memory).
  float* host_gradients_ = nullptr;
  float* host_parameters_ = nullptr;
  // The buffers the scheduler pushes from and pulls into: those, or device
  // 0's own.
  absl::Span<const float> wire_gradients_;
  absl::Span<float> wire_parameters_;
  std::unique_ptr<PushPullScheduler> scheduler_;  // over those buffers
  // Overlapping on one device whose memory is not host memory: its copies
  // to and from those pinned buffers, layer by layer. Null otherwise.
  std::unique_ptr<DeviceOverlap> device_overlap_;
  // Waits for device_overlap_'s copies (they tell scheduler_), before
  // scheduler_ goes.
  absl::Status AwaitDeviceCopies();
  // Rank 0's proposed initial parameters, kept for a server that restarts
  // without a checkpoint and asks for them again (recover_from_server_loss).
  std::vector<float> initial_parameters_;
  bool overlapping_ = false;
  // The store works in wire_gradients_ / wire_parameters_ themselves
  // (ParameterStore::BindBuffers).
  bool buffers_bound_ = false;
  // The store's server scales the loss (Registration::loss_scale): each
  // step's loss is multiplied by store_->LossScale(), and a gradient that
  // is not finite is pushed as all NaN, so that every chunk on every shard
  // counts the overflow and the step is skipped everywhere.
  bool loss_scaling_ = false;
  // Loss scaling, before the push: a gradient with a value that is not
  // finite (or the injected one) becomes all NaN.
  void PoisonOverflow(int64_t iteration);
  int64_t overflow_steps_ = 0;  // this worker's overflowed steps
  int64_t last_iteration_ = -1;  // of the last TrainStep
  // The current step's members (registration_.dynamic_members; empty: all
  // ranks, always).
  std::vector<int> members_;
  int64_t num_parameters_ = 0;

  // Epoch order cache.
  int64_t order_epoch_ = -1;
  std::vector<int64_t> order_;

  std::function<void(const EpochStats&)> on_epoch_;
  std::function<void(const StepProgress&)> on_step_;
  std::function<void(const TrainingReport::Recovery&)> on_recovery_;
};

}  // namespace ps::worker

#endif  // PS_WORKER_TRAINER_H_
