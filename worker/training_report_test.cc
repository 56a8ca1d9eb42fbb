#include "worker/training_report.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ps::worker {
namespace {

using Json = nlohmann::ordered_json;

TimeSplit Split(double base) {
  return TimeSplit{base + 0.1, base + 0.2, base + 0.3, base + 0.4,
                   base + 0.5, base + 0.6, base + 0.7};
}

TrainingReport SampleReport() {
  TrainingReport r;
  r.model = "lenet";
  r.devices = {"cpu:0", "cpu:1"};
  r.rank = 1;
  r.num_workers = 2;
  r.global_batch_size = 256;
  r.model_parameters = 61706;
  r.steps = 60;
  r.final_train_loss = 0.4321;
  r.final_test_accuracy = 0.875;
  r.samples_per_second = 12345.5;
  r.global_samples_per_second = 24691;
  r.model_bytes_to_host_per_step = 246824;
  r.model_bytes_to_device_per_step = 246824;
  r.peak_rss_bytes = 117383168;
  r.minor_faults_per_step = 12.5;
  r.split = Split(10);
  r.stopped_at_step = 59;
  r.shrunk_steps = {{40, 45}, {50, 50}};
  r.staleness = {{0, 5}, {2, 1}};
  TrainingReport::Recovery recovery;
  recovery.failed_iteration = 17;
  recovery.resumed_version = 15;
  recovery.seconds = 0.25;
  recovery.error = "Push at host:1: Connection reset by peer";
  r.recoveries.push_back(recovery);
  for (int e = 1; e <= 2; ++e) {
    EpochStats s;
    s.epoch = e;
    s.steps = 30;
    s.samples = 3840;
    s.train_loss = 1.0 / e;
    s.train_accuracy = 0.5 + 0.1 * e;
    s.test_loss = e == 1 ? -1 : 0.25;
    s.test_accuracy = e == 1 ? -1 : 0.9;
    s.validation_loss = 0.3 / e;
    s.validation_accuracy = 0.8 + 0.01 * e;
    s.train_seconds = 1.5 * e;
    s.samples_per_second = 3840 / (1.5 * e);
    s.split = Split(e);
    r.epochs.push_back(s);
  }
  return r;
}

void ExpectSplit(const Json& j, const TimeSplit& s) {
  std::vector<std::string> keys;
  for (const auto& item : j.items()) keys.push_back(item.key());
  EXPECT_EQ(keys, std::vector<std::string>({"data_s", "compute_s", "reduce_s", "copy_s", "push_s",
                                            "wait_s", "pull_s"}));
  EXPECT_DOUBLE_EQ(j["data_s"].get<double>(), s.data);
  EXPECT_DOUBLE_EQ(j["compute_s"].get<double>(), s.compute);
  EXPECT_DOUBLE_EQ(j["reduce_s"].get<double>(), s.reduce);
  EXPECT_DOUBLE_EQ(j["copy_s"].get<double>(), s.copy);
  EXPECT_DOUBLE_EQ(j["push_s"].get<double>(), s.push);
  EXPECT_DOUBLE_EQ(j["wait_s"].get<double>(), s.wait);
  EXPECT_DOUBLE_EQ(j["pull_s"].get<double>(), s.pull);
}

TEST(TrainingReportTest, JsonParsesBackToTheSameValuesInAFixedKeyOrder) {
  const TrainingReport r = SampleReport();
  const std::string text = TrainingReportToJson(r);
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');
  const Json j = Json::parse(text);

  std::vector<std::string> keys;
  for (const auto& item : j.items()) keys.push_back(item.key());
  EXPECT_EQ(keys, std::vector<std::string>(
                      {"model", "devices", "rank", "num_workers", "global_batch_size",
                       "model_parameters", "steps", "final_train_loss", "final_test_accuracy",
                       "samples_per_second", "global_samples_per_second",
                       "model_bytes_to_host_per_step", "model_bytes_to_device_per_step",
                       "peak_rss_bytes", "minor_faults_per_step", "compute", "replay_step_s",
                       "time_split", "stopped_at_step",
                       "shrunk_steps", "staleness", "recoveries", "epochs"}));
  EXPECT_EQ(j["staleness"].dump(), "{\"0\":5,\"2\":1}");
  EXPECT_EQ(j["shrunk_steps"].dump(), "[[40,45],[50,50]]");
  EXPECT_EQ(j["stopped_at_step"], 59);
  ASSERT_EQ(j["recoveries"].size(), 1u);
  EXPECT_EQ(j["recoveries"][0]["failed_iteration"], 17);
  EXPECT_EQ(j["recoveries"][0]["resumed_version"], 15);
  EXPECT_DOUBLE_EQ(j["recoveries"][0]["seconds"].get<double>(), 0.25);
  EXPECT_EQ(j["recoveries"][0]["error"], "Push at host:1: Connection reset by peer");
  EXPECT_EQ(j["compute"], "real");
  EXPECT_EQ(j["replay_step_s"], 0);
  EXPECT_EQ(j["model"], "lenet");
  EXPECT_EQ(j["devices"].get<std::vector<std::string>>(), r.devices);
  EXPECT_EQ(j["rank"], 1);
  EXPECT_EQ(j["num_workers"], 2);
  EXPECT_EQ(j["global_batch_size"], 256);
  EXPECT_EQ(j["model_parameters"], 61706);
  EXPECT_EQ(j["steps"], 60);
  EXPECT_DOUBLE_EQ(j["final_train_loss"].get<double>(), r.final_train_loss);
  EXPECT_DOUBLE_EQ(j["final_test_accuracy"].get<double>(), r.final_test_accuracy);
  EXPECT_DOUBLE_EQ(j["samples_per_second"].get<double>(), r.samples_per_second);
  EXPECT_DOUBLE_EQ(j["global_samples_per_second"].get<double>(), r.global_samples_per_second);
  EXPECT_DOUBLE_EQ(j["model_bytes_to_host_per_step"].get<double>(),
                   r.model_bytes_to_host_per_step);
  EXPECT_DOUBLE_EQ(j["model_bytes_to_device_per_step"].get<double>(),
                   r.model_bytes_to_device_per_step);
  EXPECT_EQ(j["peak_rss_bytes"], 117383168);
  EXPECT_DOUBLE_EQ(j["minor_faults_per_step"].get<double>(), 12.5);
  ExpectSplit(j["time_split"], r.split);

  ASSERT_EQ(j["epochs"].size(), 2u);
  for (size_t i = 0; i < r.epochs.size(); ++i) {
    SCOPED_TRACE(i);
    const EpochStats& e = r.epochs[i];
    const Json& je = j["epochs"][i];
    std::vector<std::string> epoch_keys;
    for (const auto& item : je.items()) epoch_keys.push_back(item.key());
    EXPECT_EQ(epoch_keys, std::vector<std::string>(
                              {"epoch", "steps", "samples", "train_loss", "train_accuracy",
                               "test_loss", "test_accuracy", "validation_loss",
                               "validation_accuracy", "train_seconds", "samples_per_second",
                               "time_split"}));
    EXPECT_EQ(je["epoch"], e.epoch);
    EXPECT_EQ(je["steps"], e.steps);
    EXPECT_EQ(je["samples"], e.samples);
    EXPECT_DOUBLE_EQ(je["train_loss"].get<double>(), e.train_loss);
    EXPECT_DOUBLE_EQ(je["train_accuracy"].get<double>(), e.train_accuracy);
    EXPECT_DOUBLE_EQ(je["test_loss"].get<double>(), e.test_loss);
    EXPECT_DOUBLE_EQ(je["test_accuracy"].get<double>(), e.test_accuracy);
    EXPECT_DOUBLE_EQ(je["validation_loss"].get<double>(), e.validation_loss);
    EXPECT_DOUBLE_EQ(je["validation_accuracy"].get<double>(), e.validation_accuracy);
    EXPECT_DOUBLE_EQ(je["train_seconds"].get<double>(), e.train_seconds);
    EXPECT_DOUBLE_EQ(je["samples_per_second"].get<double>(), e.samples_per_second);
    ExpectSplit(je["time_split"], e.split);
  }
  // tests/cluster_test.cc greps the text for these.
  EXPECT_NE(text.find("\"steps\": 60"), std::string::npos);
  EXPECT_NE(text.find("\"num_workers\": 2"), std::string::npos);
}

TEST(TrainingReportTest, EscapesStrings) {
  TrainingReport r = SampleReport();
  r.model = "le\"net\\v2\n";
  r.devices = {"cpu:\"0\""};
  const std::string text = TrainingReportToJson(r);
  EXPECT_NE(text.find(R"("le\"net\\v2\n")"), std::string::npos) << text;
  const Json j = Json::parse(text);
  EXPECT_EQ(j["model"], r.model);
  EXPECT_EQ(j["devices"][0], r.devices[0]);
}

TEST(TrainingReportTest, WritesNonFiniteNumbersAsNullAndSurvivesBadUtf8) {
  TrainingReport r = SampleReport();
  r.final_train_loss = std::numeric_limits<double>::quiet_NaN();
  r.samples_per_second = std::numeric_limits<double>::infinity();
  r.model = "bad \xff utf-8";
  const Json j = Json::parse(TrainingReportToJson(r));
  EXPECT_TRUE(j["final_train_loss"].is_null());
  EXPECT_TRUE(j["samples_per_second"].is_null());
  EXPECT_EQ(j["model"], "bad \xEF\xBF\xBD utf-8");
}

TEST(TrainingReportTest, NoEpochsIsAnEmptyList) {
  TrainingReport r;
  const Json j = Json::parse(TrainingReportToJson(r));
  EXPECT_TRUE(j["epochs"].is_array());
  EXPECT_TRUE(j["epochs"].empty());
  EXPECT_EQ(j["final_test_accuracy"], -1.0);
}

}  // namespace
}  // namespace ps::worker
