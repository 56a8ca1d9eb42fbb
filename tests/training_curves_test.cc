// A LeNet run on Fashion-MNIST with --validation_fraction=0.1 --plot: the
// PNG carries the curves it drew (its "ps-curves" text chunk), which match
// the report's numbers epoch by epoch; the hold-out is not trained on (the
// worker trains on 54,000 of the 60,000 samples; data::SplitHoldout's test
// shows the two sets are disjoint).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/subprocess.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/process.h"

namespace ps {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

// The text of chunk `keyword` of a PNG (tEXt or uncompressed iTXt); "" if
// absent or not a PNG.
std::string PngText(const std::string& png, const std::string& keyword) {
  if (png.compare(0, 8, "\x89PNG\r\n\x1a\n") != 0) return "";
  size_t at = 8;
  while (at + 12 <= png.size()) {
    const uint32_t length = (static_cast<uint8_t>(png[at]) << 24) |
                            (static_cast<uint8_t>(png[at + 1]) << 16) |
                            (static_cast<uint8_t>(png[at + 2]) << 8) |
                            static_cast<uint8_t>(png[at + 3]);
    const std::string type = png.substr(at + 4, 4);
    if (at + 12 + length > png.size()) return "";
    const std::string data = png.substr(at + 8, length);
    if ((type == "tEXt" || type == "iTXt") && data.compare(0, keyword.size() + 1,
                                                           keyword + std::string(1, '\0')) == 0) {
      std::string text = data.substr(keyword.size() + 1);
      if (type == "iTXt") {
        // compression flag, method, language\0, translated keyword\0, text.
        if (text.size() < 2 || text[0] != 0) return "";
        size_t p = text.find('\0', 2);
        p = p == std::string::npos ? p : text.find('\0', p + 1);
        if (p == std::string::npos) return "";
        text = text.substr(p + 1);
      }
      return text;
    }
    at += 12 + length;
  }
  return "";
}

TEST(TrainingCurvesTest, ThePlotDrawsTheReportsNumbers) {
  const std::string png_path = testing::TestTmpPath("curves.png");
  const std::string report_path = testing::TestTmpPath("report.json");
  tests::Process worker(testing::RunfilePath("worker/worker"),
                        {"--model=lenet", "--epochs=2", "--batch_size=256", "--lr=0.9",
                         "--devices=cpu", "--threads=1", "--validation_fraction=0.1",
                         "--plot=" + png_path, "--report=" + report_path, "--progress=false"},
                        testing::TestTmpPath("worker.log"));
  ASSERT_EQ(worker.Wait(std::chrono::seconds(300)), 0) << worker.Log();
  // The hold-out is out of the training set.
  EXPECT_THAT(worker.Log(), HasSubstr("54000 train / 10000 test samples"));
  EXPECT_THAT(worker.Log(), HasSubstr("validation acc"));

  const Json report = Json::parse(testing::ReadFileBytes(report_path));
  const std::string text = PngText(testing::ReadFileBytes(png_path), "ps-curves");
  ASSERT_FALSE(text.empty()) << "no ps-curves chunk in " << png_path;
  const Json curves = Json::parse(text);
  ASSERT_EQ(report["epochs"].size(), 2u);
  ASSERT_EQ(curves["epoch"].size(), 2u);
  for (size_t e = 0; e < 2; ++e) {
    SCOPED_TRACE(e);
    const Json& epoch = report["epochs"][e];
    EXPECT_EQ(curves["epoch"][e], epoch["epoch"]);
    for (const char* key : {"train_loss", "train_accuracy", "validation_accuracy",
                            "test_accuracy"}) {
      EXPECT_DOUBLE_EQ(curves[key][e].get<double>(), epoch[key].get<double>()) << key;
    }
    EXPECT_GE(epoch["validation_accuracy"].get<double>(), 0);
  }
}

}  // namespace
}  // namespace ps
