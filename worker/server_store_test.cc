#include "worker/server_store.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

TEST(SplitServerListTest, TrimsEntriesAndSkipsEmptyOnes) {
  EXPECT_THAT(SplitServerList("127.0.0.1:5000"), ElementsAre("127.0.0.1:5000"));
  EXPECT_THAT(SplitServerList(" a:1 ,b:2,, c:3 "), ElementsAre("a:1", "b:2", "c:3"));
  EXPECT_THAT(SplitServerList(""), IsEmpty());
  EXPECT_THAT(SplitServerList(" , ,"), IsEmpty());
}

// Creating opens no connection, so nothing needs to listen at the addresses.
TEST(CreateServerStoreTest, OneAddressIsOneServerAndSeveralAreShards) {
  RemoteStoreOptions remote;
  auto one = CreateServerStore("127.0.0.1:1", remote);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->num_shards, 1);
  ASSERT_NE(one->store, nullptr);
  EXPECT_TRUE(one->readings.remote());
  EXPECT_EQ(one->readings.bytes_pushed(), 0);

  auto two = CreateServerStore("127.0.0.1:1, 127.0.0.1:2", remote);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->num_shards, 2);
  EXPECT_EQ(two->readings.bytes_pulled(), 0);
}

TEST(CreateServerStoreTest, RefusesNamingTheProblem) {
  RemoteStoreOptions remote;
  auto none = CreateServerStore(" , ", remote);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(none.status().message()), HasSubstr("names no host:port"));

  EXPECT_EQ(CreateServerStore("a:1,a:1", remote).status().code(),
            absl::StatusCode::kInvalidArgument);

  remote.compression = "zip";
  const absl::Status unknown = CreateServerStore("127.0.0.1:1", remote).status();
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unknown.message()), HasSubstr("zip"));
}

}  // namespace
}  // namespace ps::worker
