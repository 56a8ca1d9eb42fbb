#include "common/int_list.h"

#include "gtest/gtest.h"

namespace ps {
namespace {

TEST(ParsePositiveIntListTest, ParsesAndRejectsWithTheItem) {
  auto shape = ParsePositiveIntList("--input_shape", "1,28,28");
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(*shape, (std::vector<int64_t>{1, 28, 28}));
  EXPECT_EQ(*ParsePositiveIntList("--mlp_hidden", "256,,64"), (std::vector<int64_t>{256, 64}));
  for (const char* bad : {"3,x", "0", "-4", "1.5"}) {
    auto parsed = ParsePositiveIntList("--mlp_hidden", bad);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(parsed.status().message().find("--mlp_hidden"), absl::string_view::npos);
  }
}

}  // namespace
}  // namespace ps
