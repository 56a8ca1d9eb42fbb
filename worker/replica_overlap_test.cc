#include "worker/replica_overlap.h"

#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "worker/fake_stores.h"

namespace ps::worker {
namespace {

using testing::RecordingStore;

// D replicas of a model of `ends.size()` layers, layer l being segment l
// (one bucket each), over a RecordingStore.
struct Rig {
  Rig(int d, std::vector<int64_t> ends) : store(ends), n(ends.back()) {
    for (int r = 0; r < d; ++r) {
      gradients.emplace_back(n);
      parameters.emplace_back(n, -1.f);
      for (int64_t i = 0; i < n; ++i) gradients[r][i] = 1.f / (3 + i + 7 * r);
    }
    PushPullOptions options;
    options.bucket_bytes = 0;
    auto s = PushPullScheduler::Create(options, &store, gradients[0],
                                       absl::MakeSpan(parameters[0]), /*version=*/5);
    EXPECT_TRUE(s.ok()) << s.status();
    scheduler = std::move(*s);
    EXPECT_TRUE(scheduler->BeginIteration(1).ok());
    std::vector<float*> g, p;
    for (int r = 0; r < d; ++r) {
      g.push_back(gradients[r].data());
      p.push_back(parameters[r].data());
    }
    overlap = std::make_unique<ReplicaOverlap>(scheduler.get(), g, p, n);
  }

  // Replica 0's gradients as DeviceCollective::ReduceSumToRoot leaves them.
  std::vector<float> Sum(const std::vector<bool>& computing) const {
    std::vector<float> sum = gradients[0];
    for (size_t r = 1; r < gradients.size(); ++r) {
      if (!computing[r]) continue;
      for (int64_t i = 0; i < n; ++i) sum[i] += gradients[r][i];
    }
    return sum;
  }

  RecordingStore store;
  const int64_t n;
  std::vector<std::vector<float>> gradients, parameters;
  std::unique_ptr<PushPullScheduler> scheduler;
  std::unique_ptr<ReplicaOverlap> overlap;
};

TEST(ReplicaOverlapTest, ARegionIsPushedOnceEveryReplicaHasItAndCarriesTheirSum) {
  Rig rig(2, {4, 8, 12});
  ASSERT_TRUE(rig.overlap->BeginStep({true, true}).ok());
  const std::vector<float> want = rig.Sum({true, true});
  // Layer 2 done on replica 1 only: nothing goes.
  rig.overlap->hooks(1)->AfterBackward(8, 12);
  EXPECT_TRUE(rig.store.pushed().empty());
  rig.overlap->hooks(0)->AfterBackward(8, 12);
  auto pushed = rig.store.pushed();
  ASSERT_EQ(pushed.size(), 1u);
  EXPECT_EQ(pushed[0].first, 2);
  EXPECT_EQ(pushed[0].values, std::vector<float>(want.begin() + 8, want.end()));
  // Layer 1's gradients early on both (a Linear before its dx): pushed.
  rig.overlap->hooks(0)->GradientsReady(4, 8);
  EXPECT_EQ(rig.store.pushed().size(), 1u);
  rig.overlap->hooks(1)->GradientsReady(4, 8);
  pushed = rig.store.pushed();
  ASSERT_EQ(pushed.size(), 2u);
  EXPECT_EQ(pushed[1].first, 1);
  EXPECT_EQ(pushed[1].values, std::vector<float>(want.begin() + 4, want.begin() + 8));
  rig.overlap->hooks(0)->AfterBackward(4, 8);
  rig.overlap->hooks(1)->AfterBackward(4, 8);
  // Layer 0 reported by neither: FinishStep sums and pushes it.
  rig.overlap->FinishStep();
  pushed = rig.store.pushed();
  ASSERT_EQ(pushed.size(), 3u);
  EXPECT_EQ(pushed[2].first, 0);
  EXPECT_EQ(pushed[2].values, std::vector<float>(want.begin(), want.begin() + 4));
  EXPECT_EQ(rig.gradients[0], want);
  // Every bucket's pull landed in replica 0; replica 1 copies a layer's
  // before its forward, and only that layer's.
  EXPECT_TRUE(rig.scheduler->AwaitAll().ok());
  EXPECT_EQ(rig.parameters[0], std::vector<float>(12, 6.f));
  ASSERT_TRUE(rig.overlap->hooks(1)->BeforeForward(4, 8).ok());
  EXPECT_EQ(rig.parameters[1], (std::vector<float>{-1, -1, -1, -1, 6, 6, 6, 6, -1, -1, -1, -1}));
}

// Replicas without samples run no pass: they are neither waited for nor
// summed; replica 0 always has samples when any replica has.
TEST(ReplicaOverlapTest, ReplicasWithoutSamplesAreLeftOut) {
  Rig rig(3, {4, 8});
  ASSERT_TRUE(rig.overlap->BeginStep({true, true, false}).ok());
  const std::vector<float> want = rig.Sum({true, true, false});
  rig.overlap->hooks(0)->AfterBackward(4, 8);
  rig.overlap->hooks(1)->AfterBackward(4, 8);
  ASSERT_EQ(rig.store.pushed().size(), 1u);
  rig.overlap->hooks(0)->AfterBackward(0, 4);
  rig.overlap->hooks(1)->AfterBackward(0, 4);
  rig.overlap->FinishStep();
  EXPECT_EQ(rig.store.pushed().size(), 2u);
  EXPECT_EQ(rig.gradients[0], want);

  Rig bad(2, {4});
  EXPECT_EQ(bad.overlap->BeginStep({false, true}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.overlap->BeginStep({true}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(bad.overlap->BeginStep({false, false}).ok());
  bad.overlap->FinishStep();  // nothing summed, every bucket still pushed
  ASSERT_EQ(bad.store.pushed().size(), 1u);
  EXPECT_EQ(bad.store.pushed()[0].values, bad.gradients[0]);
}

// Three replicas reporting from their own threads, layer by layer and in
// parts, in random interleavings: every bucket is pushed once, holding the
// device-order sum bit for bit.
TEST(ReplicaOverlapTest, ConcurrentReportsPushEachBucketOnceWithTheExactSum) {
  for (int trial = 0; trial < 20; ++trial) {
    SCOPED_TRACE(trial);
    std::vector<int64_t> ends;
    for (int64_t e = 64; e <= 64 * 16; e += 64) ends.push_back(e);
    Rig rig(3, ends);
    ASSERT_TRUE(rig.overlap->BeginStep({true, true, true}).ok());
    const std::vector<float> want = rig.Sum({true, true, true});
    std::vector<std::thread> threads;
    for (int r = 0; r < 3; ++r) {
      threads.emplace_back([&rig, &ends, r, trial] {
        std::mt19937 rng(trial * 3 + r);
        for (size_t l = ends.size(); l-- > 0;) {
          const int64_t begin = l == 0 ? 0 : ends[l - 1];
          if (rng() % 2) rig.overlap->hooks(r)->GradientsReady(begin + 32, ends[l]);
          if (rng() % 4 == 0) std::this_thread::yield();
          rig.overlap->hooks(r)->AfterBackward(begin, ends[l]);
        }
      });
    }
    for (std::thread& t : threads) t.join();
    rig.overlap->FinishStep();
    const auto pushed = rig.store.pushed();
    ASSERT_EQ(pushed.size(), ends.size());
    std::vector<int> times(ends.size());
    for (const auto& p : pushed) {
      ASSERT_EQ(p.last, p.first + 1);
      ++times[p.first];
      const int64_t begin = p.first == 0 ? 0 : ends[p.first - 1];
      EXPECT_EQ(p.values, std::vector<float>(want.begin() + begin, want.begin() + ends[p.first]))
          << "bucket " << p.first;
    }
    EXPECT_EQ(times, std::vector<int>(ends.size(), 1));
  }
}

}  // namespace
}  // namespace ps::worker
