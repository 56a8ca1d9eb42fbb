#include "worker/training_report.h"

#include <initializer_list>
#include <utility>

#include "absl/strings/str_cat.h"

#include "nlohmann/json.hpp"

namespace ps::worker {
namespace {

// ordered_json keeps keys in insertion order, so the file reads (and diffs)
// the same way every run.
using Json = nlohmann::ordered_json;

// One JSON object of `fields`, keys in the order given (each function below
// lists its keys in the order training_report.h states).
Json Object(std::initializer_list<std::pair<const char*, Json>> fields) {
  Json j = Json::object();
  for (const auto& [key, value] : fields) j[key] = value;
  return j;
}

Json SplitToJson(const TimeSplit& s) {
  return Object({{"data_s", s.data}, {"compute_s", s.compute}, {"reduce_s", s.reduce},
                 {"copy_s", s.copy}, {"push_s", s.push}, {"wait_s", s.wait},
                 {"pull_s", s.pull}});
}

Json EpochToJson(const EpochStats& e) {
  return Object({{"epoch", e.epoch}, {"steps", e.steps}, {"samples", e.samples},
                 {"train_loss", e.train_loss}, {"train_accuracy", e.train_accuracy},
                 {"test_loss", e.test_loss}, {"test_accuracy", e.test_accuracy},
                 {"validation_loss", e.validation_loss},
                 {"validation_accuracy", e.validation_accuracy},
                 {"train_seconds", e.train_seconds},
                 {"samples_per_second", e.samples_per_second},
                 {"time_split", SplitToJson(e.split)}});
}

}  // namespace

std::string TrainingReportToJson(const TrainingReport& r) {
  Json j = Object({{"model", r.model}, {"devices", r.devices}, {"rank", r.rank},
                   {"num_workers", r.num_workers}, {"global_batch_size", r.global_batch_size},
                   {"model_parameters", r.model_parameters}, {"steps", r.steps},
                   {"final_train_loss", r.final_train_loss},
                   {"final_test_accuracy", r.final_test_accuracy},
                   {"samples_per_second", r.samples_per_second},
                   {"global_samples_per_second", r.global_samples_per_second},
                   {"model_bytes_to_host_per_step", r.model_bytes_to_host_per_step},
                   {"model_bytes_to_device_per_step", r.model_bytes_to_device_per_step},
                   {"peak_rss_bytes", r.peak_rss_bytes},
                   {"minor_faults_per_step", r.minor_faults_per_step}, {"compute", r.compute},
                   {"replay_step_s", r.replay_step_seconds},
                   {"time_split", SplitToJson(r.split)},
                   {"stopped_at_step", r.stopped_at_step}});
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
