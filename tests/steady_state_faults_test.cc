// Received tensor bytes land in memory reused across steps: a worker
// pushing and pulling a model through a real gRPC server (both in this
// process, on loopback) faults in few fresh pages per round once warm, with
// the allocator and settings the daemons run with (common/process_tuning.h).
// Under glibc malloc the same loop faulted thousands of pages a round
// (about a third of the pages received).

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/page_faults.h"
#include "common/process_tuning.h"
#include "gtest/gtest.h"
#include "server/in_process_server.h"
#include "worker/remote_parameter_store.h"

namespace ps {
namespace {

TEST(SteadyStateFaultsTest, PushAndPullReuseMemoryOnceWarm) {
  TuneMallocForLargeMessages();
  constexpr int64_t kTensors = 4;
  constexpr int64_t kElements = int64_t{32} << 20 >> 2;  // 32 MiB of fp32
  std::vector<ParamSpec> signature;
  for (int64_t t = 0; t < kTensors; ++t) {
    signature.push_back({absl::StrCat("layer", t), {kElements / kTensors}, DType::kF32});
  }
  server::ParameterServerOptions options;
  options.num_workers = 1;
  options.optimizer.sgd.lr = 1e-6f;
  auto server = server::InProcessServer::Start(options, signature,
                                               std::vector<float>(kElements, 0.5f));
  ASSERT_TRUE(server.ok()) << server.status();
  worker::RemoteStoreOptions store_options;
  store_options.server_address = (*server)->address();
  store_options.worker_id = "w0";
  auto store = worker::RemoteParameterStore::Create(store_options);
  ASSERT_TRUE(store.ok()) << store.status();
  auto reg = (*store)->Register(signature, {});
  ASSERT_TRUE(reg.ok()) << reg.status();

  std::vector<float> grad(kElements, 1e-3f), params(kElements);
  int64_t version = reg->version;
  constexpr int kWarmRounds = 6, kRounds = 12;
  std::vector<int64_t> faults;
  for (int r = 0; r < kWarmRounds + kRounds; ++r) {
    FaultsPerStep counter;
    ASSERT_TRUE((*store)->Push(version, 1, grad).ok());
    ASSERT_TRUE((*store)->WaitForVersion(version + 1).ok());
    auto v = (*store)->Pull(version + 1, absl::MakeSpan(params));
    ASSERT_TRUE(v.ok()) << v.status();
    version = *v;
    if (r >= kWarmRounds) faults.push_back(counter.Step());
  }
  EXPECT_EQ(version, reg->version + kWarmRounds + kRounds);
  // Each round moves 8,192 pages each way; glibc's arenas faulted a third
  // of them. The median leaves out a round where an allocator grows once.
  std::sort(faults.begin(), faults.end());
  std::printf("faults per round, sorted: %s\n", absl::StrJoin(faults, ", ").c_str());
  const int64_t median = faults[faults.size() / 2];
  const int64_t pages_each_way = kElements * 4 / 4096;
  EXPECT_LT(median, pages_each_way / 16);
}

}  // namespace
}  // namespace ps
