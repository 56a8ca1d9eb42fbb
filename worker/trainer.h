#ifndef PS_WORKER_TRAINER_H_
#define PS_WORKER_TRAINER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/device.h"
#include "worker/collective.h"
#include "worker/data/dataset.h"
#include "worker/data/loader.h"
#include "worker/model/model.h"
#include "worker/parameter_store.h"

namespace ps::worker {

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
};

// Seconds of one step's phases, summed over the steps measured.
struct TimeSplit {
  double data = 0;     // gathering the batch and copying it to the devices
  double compute = 0;  // forward, loss and backward on every device
  double reduce = 0;   // summing the devices' gradients on the devices
  double copy = 0;     // device->host gradients and host->device parameters,
                       // and the broadcast to the other devices
  double push = 0;
  double wait = 0;  // waiting for the other workers' pushes
  double pull = 0;
};

struct EpochStats {
  int64_t epoch = 0;  // 1-based
  int64_t steps = 0;
  int64_t samples = 0;  // trained on by this worker
  double train_loss = 0;      // mean over this worker's samples
  double train_accuracy = 0;
  double test_loss = -1;      // -1 when not evaluated
  double test_accuracy = -1;
  double train_seconds = 0;   // training only, evaluation excluded
  double samples_per_second = 0;  // this worker's samples / train_seconds
  TimeSplit split;
};

struct TrainingReport {
  std::string model;
  std::vector<std::string> devices;
  int rank = 0;
  int num_workers = 1;
  int64_t global_batch_size = 0;
  int64_t model_parameters = 0;
  int64_t steps = 0;
  std::vector<EpochStats> epochs;
  double final_train_loss = 0;
  double final_test_accuracy = -1;
  // Training samples/s of this worker after the first epoch (all epochs if
  // there was only one).
  double samples_per_second = 0;
  // The same for the global batches (all workers together).
  double global_samples_per_second = 0;
  // Bytes across the host link per step, summed over this worker's devices.
  double model_bytes_to_host_per_step = 0;
  double model_bytes_to_device_per_step = 0;
  TimeSplit split;  // all epochs
};

// The report as JSON (the --report file).
std::string TrainingReportToJson(const TrainingReport& report);

// Progress during an epoch: called after every step on the training thread.
struct StepProgress {
  int64_t epoch = 0;  // 1-based
  int64_t step_in_epoch = 0;  // 1-based
  int64_t steps_in_epoch = 0;
  int64_t samples = 0;  // this epoch so far
  double seconds = 0;   // this epoch so far
};

// Data-parallel training on one worker's devices, talking to a parameter
// store. One replica of the model per device; each step:
//   1. gather this worker's part of the global batch, one shard per device
//   2. forward/backward on every device concurrently (summed loss)
//   3. sum the replicas' gradients on the devices (DeviceCollective)
//   4. copy the sum to host memory once and Push it
//   5. WaitForVersion, Pull the new parameters to host memory
//   6. copy them to device 0 once and broadcast to the others
// With one device and a LocalParameterStore this is plain minibatch SGD.
class Trainer {
 public:
  // The devices, datasets and store must outlive the trainer. `test` may be
  // null. Registers with the store and loads the parameters it returns.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const TrainerOptions& options,
                                                         const model::ModelConfig& model,
                                                         std::vector<Device*> devices,
                                                         ParameterStore* store,
                                                         const data::Dataset* train,
                                                         const data::Dataset* test);
  ~Trainer();

  // Called with each finished epoch, and after each step.
  void set_epoch_callback(std::function<void(const EpochStats&)> fn) { on_epoch_ = std::move(fn); }
  void set_step_callback(std::function<void(const StepProgress&)> fn) { on_step_ = std::move(fn); }

  absl::StatusOr<TrainingReport> Run();

  // Runs one step on global batch `step` of epoch `epoch`'s order; public for
  // tests that compare single steps across configurations.
  absl::Status TrainStep(int64_t epoch, int64_t step);

  // Time spent in each phase by TrainStep since the last reset (Run resets
  // it every epoch).
  const TimeSplit& time_split() const { return split_; }
  void ResetTimeSplit() { split_ = TimeSplit(); }

  // Loss and accuracy on `dataset` in inference mode, on device 0.
  absl::Status Evaluate(const data::Dataset& dataset, double* loss, double* accuracy);

  // Replica 0 (after a step its parameters equal every replica's). Its
  // batch-norm running statistics are device 0's own, which is what
  // evaluation uses and what SaveWeights writes.
  model::Model& model() { return *replicas_[0]; }
  int64_t steps_per_epoch() const;
  const ParameterStore::Registration& registration() const { return registration_; }

 private:
  struct Replica;
  Trainer(const TrainerOptions& options, std::vector<Device*> devices, ParameterStore* store,
          const data::Dataset* train, const data::Dataset* test);

  absl::Status Init(const model::ModelConfig& model);
  absl::Status LoadShards(int64_t epoch, int64_t step, std::vector<int64_t>* shard_sizes);
  // Gathers samples `indices` of `data` into replica r's input tensors (via
  // its pinned staging buffers when its memory is not host memory).
  absl::Status StageBatch(Replica& r, const data::Dataset& data,
                          absl::Span<const int64_t> indices) const;
  // Views of the first n staged inputs and labels.
  static absl::StatusOr<std::pair<Tensor, Tensor>> StagedViews(const Replica& r, int64_t n);
  // acc[0] += loss sum, acc[1] += correct count, on the device.
  static absl::Status AccumulateMetrics(Device& device, const model::DeviceMetrics& metrics,
                                        Tensor& acc);
  absl::Status ReadAndResetMetrics(double* loss_sum, double* correct);

  const TrainerOptions options_;
  std::vector<Device*> devices_;
  ParameterStore* store_;
  const data::Dataset* train_;
  const data::Dataset* test_;

  std::vector<std::unique_ptr<model::Model>> replicas_;
  std::vector<std::unique_ptr<Replica>> replica_state_;
  std::unique_ptr<DeviceCollective> collective_;
  ParameterStore::Registration registration_;
  int64_t version_ = 0;  // parameters the replicas hold
  // Pinned host buffers for the one copy each way per step.
  float* host_gradients_ = nullptr;
  float* host_parameters_ = nullptr;
  int64_t num_parameters_ = 0;

  // Epoch order cache.
  int64_t order_epoch_ = -1;
  std::vector<int64_t> order_;

  TimeSplit split_;
  std::function<void(const EpochStats&)> on_epoch_;
  std::function<void(const StepProgress&)> on_step_;
};

}  // namespace ps::worker

#endif  // PS_WORKER_TRAINER_H_
