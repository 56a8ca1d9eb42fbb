#include "server/stall_report.h"

#include "common/cpu_device.h"
#include "common/clock.h"
#include "server/parameter_server.h"
#include "server/parameter_server_testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(StallReportTest, NamesTheMissingRankAndWhatItLastDid) {
  FakeClock clock;
  CpuDevice device(0, 1);
  ParameterServerOptions options;
  options.num_workers = 3;
  options.chunk_elements = 2;
  options.clock = &clock;
  const std::vector<ParamSpec> signature = {{"w", {4}, DType::kF32}};
  auto server = ParameterServer::Create(options, signature, {1, 2, 3, 4}, &device);
  ASSERT_TRUE(server.ok());
  auto a = (*server)->Register("a", signature, 0);
  auto b = (*server)->Register("b", signature, 1);
  ASSERT_TRUE(a.ok() && b.ok());
  for (int rank : {0, 1}) {
    for (int64_t c : {0, 1}) ASSERT_TRUE(Push(**server, rank, 0, 0, c, 1, {1.f, 1.f}).ok());
  }
  // Rank 2 has no worker yet: iteration 0 waits for it.
  EXPECT_EQ(FindStall((*server)->progress(), clock.NowNanos(), absl::Seconds(5), absl::Seconds(10))
                .report,
            "");
  clock.Advance(absl::ToInt64Nanoseconds(absl::Seconds(6)));
  Stall stall =
      FindStall((*server)->progress(), clock.NowNanos(), absl::Seconds(5), absl::Seconds(10));
  EXPECT_THAT(stall.missing, ElementsAre(2));
  EXPECT_THAT(stall.report, HasSubstr("iteration 0 has waited 6.0 s for rank 2 (no worker registered)"));
  // Rank 2 comes, pushes half, and goes silent; rank 0 keeps its heartbeat.
  auto c = (*server)->Register("c", signature, 2);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(Push(**server, 2, 0, 0, 0, 1, {1.f, 1.f}).ok());
  clock.Advance(absl::ToInt64Nanoseconds(absl::Seconds(11)));
  ASSERT_TRUE((*server)->Heartbeat(0, a->session).ok());
  EXPECT_EQ((*server)->Heartbeat(0, b->session).code(), absl::StatusCode::kPermissionDenied);
  stall = FindStall((*server)->progress(), clock.NowNanos(), absl::Seconds(5), absl::Seconds(10));
  EXPECT_THAT(stall.missing, ElementsAre(2));
  EXPECT_THAT(stall.lost, ElementsAre(2));
  EXPECT_THAT(stall.report,
              HasSubstr("rank 2 (worker 'c') pushed 1 of 2 chunks, last heard 11.0 s ago (lost: "
                        "nothing for more than 10s), last pushed iteration 0 11.0 s ago"));
  EXPECT_THAT(stall.report, HasSubstr("2 of 3 ranks have pushed it all"));
  // Once it is all in, nothing stalls.
  ASSERT_TRUE(Push(**server, 2, 0, 0, 1, 1, {1.f, 1.f}).ok());
  EXPECT_EQ((*server)->version(), 1);
  EXPECT_EQ(FindStall((*server)->progress(), clock.NowNanos(), absl::Seconds(5), absl::Seconds(10))
                .report,
            "");
}

}  // namespace
}  // namespace ps::server
