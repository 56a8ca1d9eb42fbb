#ifndef PS_TESTS_IN_PROCESS_JOB_H_
#define PS_TESTS_IN_PROCESS_JOB_H_

// For the multi-worker tests: a real gRPC parameter server in this process
// and W workers (the trainer, the remote store and its pipeline, one CPU
// device of one thread each), each on a thread of its own, training an MLP
// to the end of its steps; what each worker and the server hold afterwards.

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "server/parameter_server.h"
#include "worker/data/dataset.h"
#include "worker/trainer.h"
#include "worker/training_report.h"

namespace ps::testing {

// The tests' defaults: global batch 30, up to 100 epochs (max_steps ends
// them), data seed 3, no evaluation; an MLP of hidden layers 48 and 24.
worker::TrainerOptions JobTrainerOptions();
worker::model::ModelConfig JobModel();

struct InProcessJob {
  server::ParameterServerOptions server;  // num_workers: the workers started
  worker::model::ModelConfig model = JobModel();
  // Every worker's trainer options (max_steps is set to `steps`), then
  // `configure(rank, options)` for what differs by rank. May be empty.
  worker::TrainerOptions trainer = JobTrainerOptions();
  std::function<void(int rank, worker::TrainerOptions* options)> configure;
  int64_t steps = 6;
};

struct WorkerOutcome {
  std::vector<float> params;  // its replica's at the end
  worker::TrainingReport report;
  std::map<int64_t, int64_t> staleness;  // its store's histogram
  int64_t overflow_steps = 0;            // Trainer::overflow_steps
  float registered_loss_scale = 0;       // Registration::loss_scale
};

struct JobOutcome {
  std::vector<WorkerOutcome> workers;  // by rank
  std::vector<float> server_params;    // the newest version
  int64_t server_version = 0;
  server::ParameterServer::LossScale loss_scale;
};

// Runs `job` on `data` (a failure of any part is a test failure, and the
// outcome then has what was collected).
JobOutcome RunInProcessJob(const InProcessJob& job, const worker::data::Dataset& data);

}  // namespace ps::testing

#endif  // PS_TESTS_IN_PROCESS_JOB_H_
