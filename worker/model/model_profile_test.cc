#include "worker/model/model_profile.h"

#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ps::worker::model {
namespace {

using Json = nlohmann::ordered_json;

// A small valid profile: two layers over three tensors.
Json Valid() {
  return Json::parse(R"({
    "format": "ps-model-profile", "version": 1, "model": "tiny", "batch_size": 8,
    "measured": {"where": "here", "date": "2026-12-06", "cpu": "x", "cores": 2, "threads": 1,
                 "software": {"ps": "1"}, "steps": 3, "warmup_steps": 1, "statistic": "median"},
    "tensors": [{"name": "a.weight", "shape": [4, 3], "dtype": "float32"},
                {"name": "a.bias", "shape": [4], "dtype": "float32"},
                {"name": "b.weight", "shape": [2, 4], "dtype": "float32"}],
    "layers": [{"name": "a", "tensors": ["a.weight", "a.bias"], "forward_ms": 1.5,
                "backward_ms": 2},
               {"name": "b", "tensors": ["b.weight"], "forward_ms": 0.5, "backward_ms": 1}]
  })");
}

// The error of parsing `doc`, which must name `field` first.
void ExpectRefused(const Json& doc, const std::string& field, const std::string& why) {
  absl::StatusOr<ModelProfile> p = ParseModelProfile(doc.dump());
  ASSERT_FALSE(p.ok()) << "accepted: " << doc.dump();
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(p.status().message(), field + ": ")) << p.status();
  EXPECT_TRUE(absl::StrContains(p.status().message(), why)) << p.status();
}

TEST(ModelProfileTest, ReadsAValidProfile) {
  absl::StatusOr<ModelProfile> p = ParseModelProfile(Valid().dump());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->model, "tiny");
  EXPECT_EQ(p->batch_size, 8);
  ASSERT_EQ(p->tensors.size(), 3u);
  EXPECT_EQ(p->tensors[0].shape, (Shape{4, 3}));
  ASSERT_EQ(p->layers.size(), 2u);
  EXPECT_EQ(p->layers[0].tensors, (std::vector<std::string>{"a.weight", "a.bias"}));
  EXPECT_DOUBLE_EQ(p->layers[0].forward_ms, 1.5);
  EXPECT_DOUBLE_EQ(p->layers[0].backward_ms, 2);
  EXPECT_EQ(p->measured.software.at("ps"), "1");
  EXPECT_LT(p->total_forward_ms, 0);  // no totals
}

TEST(ModelProfileTest, WritesWhatItReads) {
  absl::StatusOr<ModelProfile> p = ParseModelProfile(Valid().dump());
  ASSERT_TRUE(p.ok()) << p.status();
  p->measured.note = "a note";
  p->total_forward_ms = 2;
  p->total_backward_ms = 3;
  absl::StatusOr<ModelProfile> again = ParseModelProfile(ModelProfileToJson(*p));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(ModelProfileToJson(*again), ModelProfileToJson(*p));
  EXPECT_EQ(again->measured.note, "a note");
  EXPECT_DOUBLE_EQ(again->total_backward_ms, 3);
}

TEST(ModelProfileTest, ReadsTheCommittedProfiles) {
  for (const char* name : {"resnet50", "vgg16", "bert_base", "lenet", "mlp-4096x4096"}) {
    absl::StatusOr<ModelProfile> p =
        ReadModelProfile(std::string("deploy/experiments/profiles/") + name + ".json");
    EXPECT_TRUE(p.ok()) << name << ": " << p.status();
  }
}

TEST(ModelProfileTest, RefusesAMissingOrUnknownField) {
  Json doc = Valid();
  doc.erase("batch_size");
  ExpectRefused(doc, "batch_size", "missing");
  doc = Valid();
  doc["layers"][1].erase("backward_ms");
  ExpectRefused(doc, "layers[1].backward_ms", "missing");
  doc = Valid();
  doc["measured"].erase("cpu");
  ExpectRefused(doc, "measured.cpu", "missing");
  doc = Valid();
  doc["tensors"][0]["stride"] = 1;
  ExpectRefused(doc, "tensors[0].stride", "unknown field");
  ExpectRefused(Json::array(), "(profile)", "JSON object");
  absl::StatusOr<ModelProfile> p = ParseModelProfile("{not json");
  ASSERT_FALSE(p.ok());
  EXPECT_TRUE(absl::StartsWith(p.status().message(), "(file): not JSON")) << p.status();
}

TEST(ModelProfileTest, RefusesAWrongFormatVersionOrType) {
  Json doc = Valid();
  doc["format"] = "other";
  ExpectRefused(doc, "format", "not 'ps-model-profile'");
  doc = Valid();
  doc["version"] = 2;
  ExpectRefused(doc, "version", "not a version");
  doc = Valid();
  doc["batch_size"] = 0;
  ExpectRefused(doc, "batch_size", "below 1");
  doc = Valid();
  doc["batch_size"] = true;
  ExpectRefused(doc, "batch_size", "must be an integer");
  doc = Valid();
  doc["model"] = "";
  ExpectRefused(doc, "model", "non-empty string");
  doc = Valid();
  doc["measured"]["software"] = Json::object();
  ExpectRefused(doc, "measured.software", "name -> version");
}

TEST(ModelProfileTest, RefusesANegativeOrEndlessTime) {
  Json doc = Valid();
  doc["layers"][0]["forward_ms"] = -1;
  ExpectRefused(doc, "layers[0].forward_ms", "negative");
  doc = Valid();
  doc["layers"][1]["backward_ms"] = 1e9;
  ExpectRefused(doc, "layers[1].backward_ms", "more than a day");
  doc = Valid();
  doc["layers"][1]["backward_ms"] = "1";
  ExpectRefused(doc, "layers[1].backward_ms", "number of milliseconds");
}

TEST(ModelProfileTest, RefusesBadOrOverflowingSizes) {
  Json doc = Valid();
  doc["tensors"][1]["shape"] = {0};
  ExpectRefused(doc, "tensors[1].shape[0]", "below 1");
  doc = Valid();
  doc["tensors"][1]["shape"] = {int64_t{1} << 40, int64_t{1} << 40};
  ExpectRefused(doc, "tensors[1].shape", "overflow int64");
  doc = Valid();
  doc["tensors"][1]["shape"] = {int64_t{1} << 30, 1024};
  ExpectRefused(doc, "tensors[1].shape", "bound");
  doc = Valid();
  doc["tensors"][1]["shape"] = {uint64_t{1} << 63};
  ExpectRefused(doc, "tensors[1].shape[0]", "overflows int64");
  doc = Valid();
  doc["tensors"][1]["shape"] = "4";
  ExpectRefused(doc, "tensors[1].shape", "list of sizes");
}

TEST(ModelProfileTest, RefusesAnUnknownDtype) {
  Json doc = Valid();
  doc["tensors"][2]["dtype"] = "float8";
  ExpectRefused(doc, "tensors[2].dtype", "unknown dtype 'float8'");
}

TEST(ModelProfileTest, RefusesATensorInNoLayerOrTwoAndRepeatedNames) {
  Json doc = Valid();
  doc["layers"][0]["tensors"] = {"a.weight"};
  ExpectRefused(doc, "tensors[1]", "'a.bias' is in no layer");
  doc = Valid();
  doc["layers"][1]["tensors"] = {"b.weight", "a.bias"};
  ExpectRefused(doc, "layers[1].tensors[1]", "layers[0]'s too");
  doc = Valid();
  doc["layers"][1]["tensors"] = {"c.weight"};
  ExpectRefused(doc, "layers[1].tensors[0]", "not in tensors");
  doc = Valid();
  doc["tensors"][2]["name"] = "a.bias";
  ExpectRefused(doc, "tensors[2].name", "repeats tensors[1]");
  doc = Valid();
  doc["layers"][1]["name"] = "a";
  ExpectRefused(doc, "layers[1].name", "repeats");
  doc = Valid();
  doc["layers"][1]["tensors"] = Json::array();
  ExpectRefused(doc, "layers[1].tensors", "non-empty list");
}

}  // namespace
}  // namespace ps::worker::model
