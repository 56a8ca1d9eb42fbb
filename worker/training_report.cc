#include "worker/training_report.h"

#include "absl/strings/str_cat.h"

#include "nlohmann/json.hpp"

namespace ps::worker {
namespace {

// ordered_json keeps keys in insertion order, so the file reads (and diffs)
// the same way every run.
using Json = nlohmann::ordered_json;

Json SplitToJson(const TimeSplit& s) {
  Json j;
  j["data_s"] = s.data;
  j["compute_s"] = s.compute;
  j["reduce_s"] = s.reduce;
  j["copy_s"] = s.copy;
  j["push_s"] = s.push;
  j["wait_s"] = s.wait;
  j["pull_s"] = s.pull;
  return j;
}

Json EpochToJson(const EpochStats& e) {
  Json j;
  j["epoch"] = e.epoch;
  j["steps"] = e.steps;
  j["samples"] = e.samples;
  j["train_loss"] = e.train_loss;
  j["train_accuracy"] = e.train_accuracy;
  j["test_loss"] = e.test_loss;
  j["test_accuracy"] = e.test_accuracy;
  j["validation_loss"] = e.validation_loss;
  j["validation_accuracy"] = e.validation_accuracy;
  j["train_seconds"] = e.train_seconds;
  j["samples_per_second"] = e.samples_per_second;
  j["time_split"] = SplitToJson(e.split);
  return j;
}

}  // namespace

std::string TrainingReportToJson(const TrainingReport& r) {
  Json j;
  j["model"] = r.model;
  j["devices"] = r.devices;
  j["rank"] = r.rank;
  j["num_workers"] = r.num_workers;
  j["global_batch_size"] = r.global_batch_size;
  j["model_parameters"] = r.model_parameters;
  j["steps"] = r.steps;
  j["final_train_loss"] = r.final_train_loss;
  j["final_test_accuracy"] = r.final_test_accuracy;
  j["samples_per_second"] = r.samples_per_second;
  j["global_samples_per_second"] = r.global_samples_per_second;
  j["model_bytes_to_host_per_step"] = r.model_bytes_to_host_per_step;
  j["model_bytes_to_device_per_step"] = r.model_bytes_to_device_per_step;
  j["peak_rss_bytes"] = r.peak_rss_bytes;
  j["compute"] = r.compute;
  j["replay_step_s"] = r.replay_step_seconds;
  j["time_split"] = SplitToJson(r.split);
  j["stopped_at_step"] = r.stopped_at_step;
  Json shrunk = Json::array();
  for (const auto& [first, last] : r.shrunk_steps) shrunk.push_back(Json::array({first, last}));
  j["shrunk_steps"] = std::move(shrunk);
  Json staleness = Json::object();
  for (const auto& [stale, messages] : r.staleness) staleness[absl::StrCat(stale)] = messages;
  j["staleness"] = std::move(staleness);
  Json recoveries = Json::array();
  for (const TrainingReport::Recovery& recovery : r.recoveries) {
    Json one;
    one["failed_iteration"] = recovery.failed_iteration;
    one["resumed_version"] = recovery.resumed_version;
    one["seconds"] = recovery.seconds;
    one["error"] = recovery.error;
    recoveries.push_back(std::move(one));
  }
  j["recoveries"] = std::move(recoveries);
  Json epochs = Json::array();
  for (const EpochStats& e : r.epochs) epochs.push_back(EpochToJson(e));
  j["epochs"] = std::move(epochs);
  // `replace`: a device or model name that is not UTF-8 must not make dump()
  // throw at the end of a training run.
  return j.dump(2, ' ', /*ensure_ascii=*/false, Json::error_handler_t::replace) + "\n";
}

}  // namespace ps::worker
