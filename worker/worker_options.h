#ifndef PS_WORKER_WORKER_OPTIONS_H_
#define PS_WORKER_WORKER_OPTIONS_H_

// Everything the worker daemon is told, typed: RunWorker's input.
// worker_flags.h builds it from the command line; tests and embedders fill
// it in directly. What needs the file system, the devices or the network
// (datasets, GPUs, TLS files, the servers) is checked by RunWorker.

#include <cstdint>
#include <string>

#include "common/devices.h"
#include "common/optimizer/loss_scale.h"
#include "common/optimizer/optimizer.h"
#include "worker/model/model.h"
#include "worker/remote_parameter_store.h"
#include "worker/trainer.h"

namespace ps::worker {

struct WorkerOptions {
  // The model: its name, mlp hidden widths and linear blocks. input_shape and
  // num_classes are the dataset's: RunWorker sets them.
  model::ModelConfig model;
  // With model.name "profile": the model profile file replayed (RunWorker
  // reads it into model.profile). Non-empty write_model_profile: RunWorker
  // measures the model (model_profiler.h), writes its profile there and
  // returns without training.
  std::string model_profile;
  std::string write_model_profile;

  // The data: a dataset name (fashion_mnist, mnist, cifar10, synthetic) and
  // its directory; a fraction of the training set (0 to 1, seeded by
  // trainer.seed) held out for validation; per-channel standardisation with
  // the training set's mean and std (false: pixel / 255 only).
  std::string dataset = "fashion_mnist";
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  double validation_fraction = 0;
  bool normalize = false;

  // The devices (default "auto": every GPU if any, else one CPU device), and
  // the CPU threads split between CPU devices (0: one per core).
  DeviceSpec devices = {DeviceType::kCpu, 1, {}, /*auto_select=*/true};
  int threads = 0;

  // How to train. RunWorker sets its observer, clock, should_stop and
  // normalization, and keeps recover_from_server_loss only with servers.
  TrainerOptions trainer;

  // Training alone (no servers): the optimizer and loss scaling in this
  // process. A parameter-server job's are the server's; steps_per_epoch is
  // worked out by RunWorker from the data.
  OptimizerOptions optimizer;
  LossScaleOptions loss_scale;

  // The servers: one host:port, or the shards' host:port,host:port,... (the
  // same list, in the same order, on every worker); empty trains alone.
  std::string servers;
  // How to reach them: RunWorker passes on worker_id, rank, connections,
  // compression, shared_memory, reconnect_timeout, tls, job_token and
  // identity_proof (values, not paths), and sets the rest (server_address from `servers`,
  // observer, report, clock, should_stop, log, steps_per_epoch).
  RemoteStoreOptions remote;
  // Check each server as this worker would connect, print what to fix and
  // return instead of training (FailedPrecondition when a check fails).
  bool check = false;

  // Output: a live progress bar on a terminal; the per-epoch curves as a PNG
  // (empty: none); the weights and the JSON report at the end (empty:
  // none); Prometheus metrics (-1: none; 0: any free port); a Chrome trace
  // written when training ends (empty: none).
  bool progress = true;
  std::string plot;
  std::string save_weights;
  std::string report;
  int metrics_port = -1;
  std::string metrics_address = "127.0.0.1";
  std::string trace;
  int64_t trace_max_events = 1000000;
};

}  // namespace ps::worker

#endif  // PS_WORKER_WORKER_OPTIONS_H_
