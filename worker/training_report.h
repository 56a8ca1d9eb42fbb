#ifndef PS_WORKER_TRAINING_REPORT_H_
#define PS_WORKER_TRAINING_REPORT_H_

// What a training run reports: per-epoch statistics and the run's totals, and
// their JSON form (the worker's --report file, read by deploy/dev/bench scripts
// and tests/cluster_test).

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "worker/time_split.h"

namespace ps::worker {

struct EpochStats {
  int64_t epoch = 0;  // 1-based
  int64_t steps = 0;
  int64_t samples = 0;  // trained on by this worker
  double train_loss = 0;      // mean over this worker's samples
  double train_accuracy = 0;
  double test_loss = -1;      // -1 when not evaluated
  double test_accuracy = -1;
  double validation_loss = -1;  // on the hold-out split; -1 without one
  double validation_accuracy = -1;
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
  // The process's peak resident memory, in bytes (getrusage's ru_maxrss),
  // when the daemon measured it at the end; -1: not measured (the trainer
  // leaves it so: it is the process's, not the trainer's).
  int64_t peak_rss_bytes = -1;
  // The process's minor page faults per step over the second half of the
  // steps (common/page_faults.h; the first half warms up), counted by the
  // daemon: near 0 where received bytes land in memory reused across
  // steps; -1: not measured, or fewer than two steps.
  double minor_faults_per_step = -1;
  // "real", or "replay" (TrainerOptions::replay_compute) with the pass it
  // replayed, in seconds (0 when real).
  std::string compute = "real";
  double replay_step_seconds = 0;
  TimeSplit split;  // all epochs
  // Each time the worker lost its server and trained on after reconnecting
  // (TrainerOptions::recover_from_server_loss).
  struct Recovery {
    int64_t failed_iteration = 0;  // the step that failed
    int64_t resumed_version = 0;   // the server's version it resumed from
    double seconds = 0;            // from the failure to training again
    std::string error;             // what the failing call said
  };
  std::vector<Recovery> recoveries;
  // The global step after which TrainerOptions::should_stop ended training
  // early; -1 when it ran to the end.
  int64_t stopped_at_step = -1;
  // Ranges [first, last] of the global steps this worker trained with fewer
  // workers than the job has (the server shrank it after losing one).
  std::vector<std::pair<int64_t, int64_t>> shrunk_steps;
  // Asynchronous consistency: staleness (updates a pushed chunk had
  // received since the version it was computed from) -> pushed messages.
  std::map<int64_t, int64_t> staleness;
};

// The report as one JSON object, indented by two spaces, ending in a newline.
// Keys, in this order: model, devices, rank, num_workers, global_batch_size,
// model_parameters, steps, final_train_loss, final_test_accuracy,
// samples_per_second, global_samples_per_second, model_bytes_to_host_per_step,
// model_bytes_to_device_per_step, peak_rss_bytes, minor_faults_per_step, compute, replay_step_s, time_split, stopped_at_step, shrunk_steps
// ([[first, last], ...]), staleness ({"0": messages, ...}; empty unless
// asynchronous), recoveries
// (each: failed_iteration, resumed_version, seconds, error), epochs. Each epoch: epoch,
// steps, samples, train_loss, train_accuracy, test_loss, test_accuracy,
// validation_loss, validation_accuracy, train_seconds, samples_per_second,
// time_split. A time_split: data_s,
// compute_s, reduce_s, copy_s, push_s, wait_s, pull_s (seconds).
//
// Strings are escaped (invalid UTF-8 becomes U+FFFD); numbers are written
// with full precision; a NaN or infinite number is written as null.
std::string TrainingReportToJson(const TrainingReport& report);

}  // namespace ps::worker

#endif  // PS_WORKER_TRAINING_REPORT_H_
