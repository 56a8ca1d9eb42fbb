#include "tests/json_file.h"

#include "common/testing/subprocess.h"
#include "gtest/gtest.h"

namespace ps::tests {

nlohmann::json ReadJsonFile(const std::string& path) {
  const std::string text = testing::ReadFileBytes(path);
  EXPECT_FALSE(text.empty()) << path;
  nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(doc.is_discarded()) << path << " is not JSON";
  return doc;
}

}  // namespace ps::tests
