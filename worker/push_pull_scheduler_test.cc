#include "worker/push_pull_scheduler.h"

#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "worker/fake_stores.h"
#include "worker/parameter_store.h"

namespace ps::worker {
namespace {

// A store whose asynchronous calls wait in a list until the test completes
// them; pulls fill their segments with the version they bring.
class ManualStore final : public testing::AsyncOnlyStore {
 public:
  struct Call {
    bool push = false;
    int64_t iteration_or_version = 0;
    int64_t num_samples = 0;
    int first = 0, last = 0;
    Done done;
    absl::Span<float> params;  // a pull's destination
  };

  // `streams`: each segment's (SegmentStreams); empty: all on stream 0.
  explicit ManualStore(std::vector<int64_t> ends, std::vector<int> streams = {})
      : AsyncOnlyStore(std::move(ends)), streams_(std::move(streams)) {}

  std::vector<int> SegmentStreams() const override {
    return streams_.empty() ? ParameterStore::SegmentStreams() : streams_;
  }
  void PushSegments(int64_t iteration, int64_t num_samples, int first, int last,
                    absl::Span<const float>, Done done) override {
    absl::MutexLock lock(&mu_);
    calls_.push_back({true, iteration, num_samples, first, last, std::move(done)});
  }
  void PullSegments(int64_t version, int first, int last, absl::Span<float> params,
                    Done done) override {
    absl::MutexLock lock(&mu_);
    calls_.push_back({false, version, 0, first, last, std::move(done), params});
  }

  // The calls issued and not completed, in issue order, as "push 3-4@7".
  std::vector<std::string> Pending() {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> out;
    for (const Call& c : calls_) out.push_back(Describe(c));
    return out;
  }

  // Fails every pending call (so a scheduler being destroyed stops
  // waiting for them; after an error it issues nothing more).
  void FailAll() {
    for (;;) {
      Call call;
      {
        absl::MutexLock lock(&mu_);
        if (calls_.empty()) return;
        call = std::move(calls_.front());
        calls_.pop_front();
      }
      call.done(absl::CancelledError("test over"));
    }
  }

  // Completes the pending call described as `what` (a pull writes its
  // version into its segments first).
  void Complete(const std::string& what, absl::Status status = absl::OkStatus()) {
    Call call;
    {
      absl::MutexLock lock(&mu_);
      auto it = calls_.begin();
      while (it != calls_.end() && Describe(*it) != what) ++it;
      ASSERT_NE(it, calls_.end()) << "no pending " << what;
      call = std::move(*it);
      calls_.erase(it);
      if (!call.push && status.ok()) {
        for (int64_t i = Begin(call.first); i < ends()[call.last - 1]; ++i) {
          call.params[i] = static_cast<float>(call.iteration_or_version);
        }
      }
    }
    call.done(status);
  }

 private:
  static std::string Describe(const Call& c) {
    return absl::StrCat(c.push ? "push " : "pull ", c.first, "-", c.last, "@",
                        c.iteration_or_version);
  }

  const std::vector<int> streams_;
  absl::Mutex mu_;
  std::deque<Call> calls_ ABSL_GUARDED_BY(mu_);
};

using Strings = std::vector<std::string>;

struct Rig {
  explicit Rig(std::vector<int64_t> ends, PushPullOptions options = {},
               std::vector<int64_t> layer_begins = {}, std::vector<int> streams = {})
      : store(ends, std::move(streams)), gradients(ends.back()), params(ends.back()) {
    auto s = PushPullScheduler::Create(options, &store, gradients, absl::MakeSpan(params),
                                       /*version=*/5, layer_begins);
    EXPECT_TRUE(s.ok()) << s.status();
    scheduler = std::move(*s);
  }
  ~Rig() { store.FailAll(); }
  ManualStore store;
  std::vector<float> gradients;
  std::vector<float> params;
  std::unique_ptr<PushPullScheduler> scheduler;
};

// Four segments of 100 elements (400 bytes each).
const std::vector<int64_t> kEnds = {100, 200, 300, 400};

PushPullOptions Buckets(int64_t bucket_bytes, int64_t in_flight = 0) {
  PushPullOptions o;
  o.bucket_bytes = bucket_bytes;
  o.max_bytes_in_flight = in_flight;
  return o;
}

TEST(PushPullSchedulerTest, GroupsSegmentsIntoBucketsOfAtLeastTheBucketBytes) {
  Rig one_each(kEnds, Buckets(0));
  EXPECT_EQ(one_each.scheduler->num_buckets(), 4);
  Rig pairs(kEnds, Buckets(800));
  ASSERT_EQ(pairs.scheduler->num_buckets(), 2);
  EXPECT_EQ(pairs.scheduler->bucket(1).begin, 200);
  EXPECT_EQ(pairs.scheduler->bucket(1).first_segment, 2);
  EXPECT_EQ(pairs.scheduler->bucket(1).last_segment, 4);
  Rig odd(kEnds, Buckets(1200));  // 3 segments, then the short rest
  ASSERT_EQ(odd.scheduler->num_buckets(), 2);
  EXPECT_EQ(odd.scheduler->bucket(0).end, 300);
  Rig whole(kEnds, Buckets(int64_t{1} << 40));
  EXPECT_EQ(whole.scheduler->num_buckets(), 1);
  // A full segment (800 bytes) after small ones is a bucket of its own: the
  // small ones close theirs, short as it is, rather than hold it back (a
  // layer's short tail message before the next layer's first full chunk).
  Rig tail(/*ends=*/{100, 150, 350, 400}, Buckets(800));
  ASSERT_EQ(tail.scheduler->num_buckets(), 3);
  EXPECT_EQ(tail.scheduler->bucket(0).end, 150);
  EXPECT_EQ(tail.scheduler->bucket(0).last_segment, 2);
  EXPECT_EQ(tail.scheduler->bucket(1).begin, 150);
  EXPECT_EQ(tail.scheduler->bucket(1).end, 350);
  EXPECT_EQ(tail.scheduler->bucket(1).first_segment, 2);
  EXPECT_EQ(tail.scheduler->bucket(2).begin, 350);
}

TEST(PushPullSchedulerTest, PushesAsLayersFinishAndPullsEachBucketAfterItsPush) {
  Rig rig(kEnds, Buckets(0));
  PushPullScheduler& s = *rig.scheduler;
  ASSERT_TRUE(s.BeginIteration(32).ok());
  EXPECT_EQ(s.version(), 6);
  // Backward: the last layer's gradients first.
  s.GradientsReadyFrom(250);  // only bucket 3 lies wholly above 250
  EXPECT_EQ(rig.store.Pending(), Strings({"push 3-4@5"}));
  s.GradientsReadyFrom(100);
  EXPECT_EQ(rig.store.Pending(), Strings({"push 3-4@5", "push 1-2@5", "push 2-3@5"}));
  EXPECT_FALSE(s.HasParameters(300, 400));
  EXPECT_TRUE(s.HasParameters(0, 100));  // not pushed yet: holds version 5
  rig.store.Complete("push 3-4@5");
  EXPECT_EQ(rig.store.Pending(), Strings({"push 1-2@5", "push 2-3@5", "pull 3-4@6"}));
  rig.store.Complete("pull 3-4@6");
  EXPECT_TRUE(s.HasParameters(300, 400));
  EXPECT_EQ(rig.params[399], 6.f);
  s.GradientsReadyFrom(0);
  rig.store.Complete("push 0-1@5");
  rig.store.Complete("push 1-2@5");
  rig.store.Complete("push 2-3@5");
  EXPECT_TRUE(s.AwaitPushes().ok());
  EXPECT_EQ(rig.store.Pending(), Strings({"pull 0-1@6", "pull 1-2@6", "pull 2-3@6"}));
  for (const char* pull : {"pull 2-3@6", "pull 0-1@6", "pull 1-2@6"}) rig.store.Complete(pull);
  ASSERT_TRUE(s.AwaitAll().ok());
  EXPECT_EQ(rig.params[0], 6.f);
  // The next iteration pushes for iteration 6.
  ASSERT_TRUE(s.BeginIteration(32).ok());
  s.GradientsReadyFrom(0);
  EXPECT_EQ(rig.store.Pending().front(), "push 0-1@6");
  for (int b = 0; b < 4; ++b) rig.store.Complete(absl::StrCat("push ", b, "-", b + 1, "@6"));
  for (int b = 0; b < 4; ++b) rig.store.Complete(absl::StrCat("pull ", b, "-", b + 1, "@7"));
  EXPECT_TRUE(s.AwaitAll().ok());
}

// A layer that has its weight gradients but still reads its weights (it
// computes its input gradient next): its buckets are pushed at once, but
// their pulls wait until the layer lets go of the parameters.
TEST(PushPullSchedulerTest, EarlyGradientsArePushedButNotPulledUntilReleased) {
  Rig rig(kEnds, Buckets(0));
  PushPullScheduler& s = *rig.scheduler;
  ASSERT_TRUE(s.BeginIteration(8).ok());
  s.EarlyGradientsFrom(200);
  EXPECT_EQ(rig.store.Pending(), Strings({"push 2-3@5", "push 3-4@5"}));
  rig.store.Complete("push 3-4@5");
  EXPECT_EQ(rig.store.Pending(), Strings({"push 2-3@5"}));  // no pull yet
  s.GradientsReadyFrom(300);  // bucket 3's parameters are free, bucket 2's not yet
  EXPECT_EQ(rig.store.Pending(), Strings({"push 2-3@5", "pull 3-4@6"}));
  rig.store.Complete("push 2-3@5");
  EXPECT_EQ(rig.store.Pending(), Strings({"pull 3-4@6"}));
  s.GradientsReadyFrom(0);
  EXPECT_EQ(rig.store.Pending(),
            Strings({"pull 3-4@6", "push 0-1@5", "push 1-2@5", "pull 2-3@6"}));
  rig.store.Complete("push 0-1@5");
  rig.store.Complete("push 1-2@5");
  for (int b = 0; b < 4; ++b) rig.store.Complete(absl::StrCat("pull ", b, "-", b + 1, "@6"));
  EXPECT_TRUE(s.AwaitAll().ok());
}

// Staging: the same layer's buckets are pulled as soon as their pushes are
// accepted, into a buffer aside, and reach the parameters only when the
// layer lets go of them: at once for what has landed, on arrival for the
// rest. The forward waits for the copy.
TEST(PushPullSchedulerTest, StagedEarlyPullsLandAsideUntilReleased) {
  PushPullOptions options = Buckets(0);
  options.stage_early_pulls = true;
  Rig rig(kEnds, options);
  PushPullScheduler& s = *rig.scheduler;
  ASSERT_TRUE(s.BeginIteration(8).ok());
  s.EarlyGradientsFrom(200);
  rig.store.Complete("push 3-4@5");
  EXPECT_EQ(rig.store.Pending(), Strings({"push 2-3@5", "pull 3-4@6"}));  // at once
  rig.store.Complete("pull 3-4@6");
  EXPECT_EQ(rig.params[350], 0.f) << "a staged pull wrote where the layer still reads";
  EXPECT_FALSE(s.HasParameters(300, 400));
  s.GradientsReadyFrom(300);  // copied in now
  EXPECT_EQ(rig.params[300], 6.f);
  EXPECT_EQ(rig.params[399], 6.f);
  EXPECT_TRUE(s.HasParameters(300, 400));
  rig.store.Complete("push 2-3@5");
  EXPECT_EQ(rig.store.Pending(), Strings({"pull 2-3@6"}));
  s.GradientsReadyFrom(0);  // bucket 2's pull is still out: copied on arrival
  EXPECT_FALSE(s.HasParameters(200, 300));
  EXPECT_EQ(rig.params[250], 0.f);
  rig.store.Complete("pull 2-3@6");
  EXPECT_TRUE(s.HasParameters(200, 300));
  EXPECT_EQ(rig.params[200], 6.f);
  EXPECT_EQ(rig.params[299], 6.f);
  // Released buckets pull straight into the parameters.
  rig.store.Complete("push 0-1@5");
  rig.store.Complete("push 1-2@5");
  rig.store.Complete("pull 0-1@6");
  rig.store.Complete("pull 1-2@6");
  EXPECT_TRUE(s.AwaitAll().ok());
  EXPECT_EQ(rig.params, std::vector<float>(400, 6.f));
  // The next iteration stages afresh.
  ASSERT_TRUE(s.BeginIteration(8).ok());
  s.EarlyGradientsFrom(300);
  rig.store.Complete("push 3-4@6");
  rig.store.Complete("pull 3-4@7");
  EXPECT_EQ(rig.params[350], 6.f);
  s.GradientsReadyFrom(0);
  EXPECT_EQ(rig.params[350], 7.f);
}

// The next iteration's release starts afresh, but a previous iteration's
// pull still queued behind the bound is not held back by it (the next
// forward waits for it).
TEST(PushPullSchedulerTest, AQueuedPullOfThePreviousIterationStillGoes) {
  Rig rig(kEnds, Buckets(0, /*in_flight=*/400));
  PushPullScheduler& s = *rig.scheduler;
  ASSERT_TRUE(s.BeginIteration(8).ok());
  s.GradientsReadyFrom(200);
  rig.store.Complete("push 2-3@5");
  rig.store.Complete("push 3-4@5");  // pull 3 waits behind pull 2
  EXPECT_EQ(rig.store.Pending(), Strings({"pull 2-3@6"}));
  s.GradientsReadyFrom(0);
  rig.store.Complete("push 0-1@5");
  rig.store.Complete("push 1-2@5");
  rig.store.Complete("pull 2-3@6");
  rig.store.Complete("pull 0-1@6");
  rig.store.Complete("pull 1-2@6");
  ASSERT_TRUE(s.HasParameters(0, 300));
  ASSERT_TRUE(s.BeginIteration(8).ok());  // the next step's forward is under way
  EXPECT_EQ(rig.store.Pending(), Strings({"pull 3-4@6"}));
  rig.store.Complete("pull 3-4@6");
  EXPECT_TRUE(s.AwaitParameters(300, 400).ok());
}

TEST(PushPullSchedulerTest, BoundsBytesInFlightAndLetsFrontBucketsGoFirst) {
  // Room for two buckets each way.
  Rig rig(kEnds, Buckets(0, /*in_flight=*/800));
  PushPullScheduler& s = *rig.scheduler;
  ASSERT_TRUE(s.BeginIteration(8).ok());
  s.GradientsReadyFrom(300);
  s.GradientsReadyFrom(200);
  s.GradientsReadyFrom(100);
  // Buckets 3 and 2 went at once; 1 waits for room.
  EXPECT_EQ(rig.store.Pending(), Strings({"push 3-4@5", "push 2-3@5"}));
  s.GradientsReadyFrom(0);
  rig.store.Complete("push 2-3@5");
  // The front bucket 0 jumps ahead of bucket 1, which was ready before it.
  EXPECT_EQ(rig.store.Pending(), Strings({"push 3-4@5", "push 0-1@5", "pull 2-3@6"}));
  rig.store.Complete("push 0-1@5");
  EXPECT_EQ(rig.store.Pending(),
            Strings({"push 3-4@5", "pull 2-3@6", "push 1-2@5", "pull 0-1@6"}));
}

// Two shards' segments (streams 0 and 1): no bucket spans both, and each
// shard's pushes and pulls are bounded on their own, so a shard whose next
// bucket must wait does not hold up the other's.
TEST(PushPullSchedulerTest, EachStreamIsBucketedAndBoundedOnItsOwn) {
  Rig whole(kEnds, Buckets(int64_t{1} << 40), {}, {0, 0, 1, 1});
  ASSERT_EQ(whole.scheduler->num_buckets(), 2);
  EXPECT_EQ(whole.scheduler->bucket(0).end, 200);
  EXPECT_EQ(whole.scheduler->bucket(0).stream, 0);
  EXPECT_EQ(whole.scheduler->bucket(1).stream, 1);

  Rig rig(kEnds, Buckets(0, /*in_flight=*/400), {}, {0, 0, 1, 1});
  PushPullScheduler& s = *rig.scheduler;
  ASSERT_TRUE(s.BeginIteration(1).ok());
  s.GradientsReadyFrom(0);
  // One bucket in flight per shard, each shard's front bucket first.
  EXPECT_EQ(rig.store.Pending(), Strings({"push 0-1@5", "push 2-3@5"}));
  rig.store.Complete("push 2-3@5");
  EXPECT_EQ(rig.store.Pending(), Strings({"push 0-1@5", "push 3-4@5", "pull 2-3@6"}));
  // With the segments on one stream, the same bound lets one bucket out.
  Rig one(kEnds, Buckets(0, /*in_flight=*/400));
  ASSERT_TRUE(one.scheduler->BeginIteration(1).ok());
  one.scheduler->GradientsReadyFrom(0);
  EXPECT_EQ(one.store.Pending(), Strings({"push 0-1@5"}));
}

TEST(PushPullSchedulerTest, FrontLayersFirstAndWithinALayerFromItsLastBucket) {
  // Six buckets: layer A = buckets 0-1, layer B = buckets 2-4, layer C = 5;
  // one bucket in flight each way.
  const std::vector<int64_t> ends = {100, 200, 300, 400, 500, 600};
  Rig rig(ends, Buckets(0, /*in_flight=*/100), /*layer_begins=*/{0, 200, 500});
  PushPullScheduler& s = *rig.scheduler;
  auto pending = [&](const char* kind) {
    Strings out;
    for (const std::string& call : rig.store.Pending()) {
      if (call.rfind(kind, 0) == 0) out.push_back(call);
    }
    return out;
  };
  ASSERT_TRUE(s.BeginIteration(8).ok());
  s.GradientsReadyFrom(500);
  EXPECT_EQ(pending("push"), Strings({"push 5-6@5"}));
  // Layer B's buckets queue behind the one in flight.
  s.GradientsReadyFrom(200);
  rig.store.Complete("push 5-6@5");
  // From B's last bucket, the order backward made them in, not its front one.
  EXPECT_EQ(pending("push"), Strings({"push 4-5@5"}));
  // Layer A, ready now, goes before the rest of B (the next forward needs
  // it first), again from its last bucket.
  s.GradientsReadyFrom(0);
  Strings pushes;
  while (!pending("push").empty()) {
    pushes.push_back(pending("push")[0]);
    rig.store.Complete(pushes.back());
  }
  EXPECT_EQ(pushes, Strings({"push 4-5@5", "push 1-2@5", "push 0-1@5", "push 3-4@5",
                             "push 2-3@5"}));
  // The pulls: C's went first, as its push was the first done; those
  // queued behind it go in the same order as the pushes.
  Strings pulls;
  while (!pending("pull").empty()) {
    pulls.push_back(pending("pull")[0]);
    rig.store.Complete(pulls.back());
  }
  EXPECT_EQ(pulls, Strings({"pull 5-6@6", "pull 1-2@6", "pull 0-1@6", "pull 4-5@6",
                            "pull 3-4@6", "pull 2-3@6"}));
}

TEST(PushPullSchedulerTest, RefusesLayerOffsetsThatDoNotAscendWithinTheBuffers) {
  ManualStore store(kEnds);
  std::vector<float> buffer(400);
  for (const std::vector<int64_t>& begins :
       {std::vector<int64_t>{0, 200, 200}, {0, 300, 100}, {-1}, {0, 400}}) {
    auto s = PushPullScheduler::Create({}, &store, buffer, absl::MakeSpan(buffer), 0, begins);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find("must ascend"), std::string::npos) << s.status();
  }
}

TEST(PushPullSchedulerTest, ALargeBucketStillGoesAlone) {
  Rig rig(kEnds, Buckets(0, /*in_flight=*/100));  // smaller than any bucket
  ASSERT_TRUE(rig.scheduler->BeginIteration(8).ok());
  rig.scheduler->GradientsReadyFrom(0);
  EXPECT_EQ(rig.store.Pending(), Strings({"push 0-1@5"}));
  rig.store.Complete("push 0-1@5");
  EXPECT_EQ(rig.store.Pending(), Strings({"push 1-2@5", "pull 0-1@6"}));
}

TEST(PushPullSchedulerTest, AwaitParametersBlocksUntilThePullArrives) {
  Rig rig(kEnds, Buckets(0));
  PushPullScheduler& s = *rig.scheduler;
  ASSERT_TRUE(s.BeginIteration(8).ok());
  s.GradientsReadyFrom(0);
  for (int b = 0; b < 4; ++b) rig.store.Complete(absl::StrCat("push ", b, "-", b + 1, "@5"));
  std::thread completer([&] {
    absl::SleepFor(absl::Milliseconds(20));
    rig.store.Complete("pull 1-2@6");
  });
  EXPECT_FALSE(s.HasParameters(150, 160));
  EXPECT_TRUE(s.AwaitParameters(150, 160).ok());
  EXPECT_EQ(rig.params[150], 6.f);
  EXPECT_FALSE(s.HasParameters(0, 101));  // bucket 0 still out
  completer.join();
  for (int b : {0, 2, 3}) rig.store.Complete(absl::StrCat("pull ", b, "-", b + 1, "@6"));
}

TEST(PushPullSchedulerTest, TheFirstErrorIsKeptAndStopsFurtherCalls) {
  Rig rig(kEnds, Buckets(0, /*in_flight=*/400));
  PushPullScheduler& s = *rig.scheduler;
  ASSERT_TRUE(s.BeginIteration(8).ok());
  s.GradientsReadyFrom(0);
  rig.store.Complete("push 0-1@5", absl::UnavailableError("server gone"));
  EXPECT_TRUE(rig.store.Pending().empty());  // nothing more was issued
  const absl::Status all = s.AwaitAll();
  EXPECT_EQ(all.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(all.message(), "server gone");
  EXPECT_EQ(s.AwaitParameters(0, 400).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.BeginIteration(8).code(), absl::StatusCode::kUnavailable);
}

TEST(PushPullSchedulerTest, AnIterationCannotBeginBeforeThePreviousWasPushed) {
  Rig rig(kEnds, Buckets(0));
  PushPullScheduler& s = *rig.scheduler;
  ASSERT_TRUE(s.BeginIteration(8).ok());
  s.GradientsReadyFrom(200);
  const absl::Status early = s.BeginIteration(8);
  EXPECT_EQ(early.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(early.message().find("bucket 0"), std::string::npos) << early;
  s.GradientsReadyFrom(0);
  for (int b = 0; b < 4; ++b) rig.store.Complete(absl::StrCat("push ", b, "-", b + 1, "@5"));
  for (int b = 0; b < 4; ++b) rig.store.Complete(absl::StrCat("pull ", b, "-", b + 1, "@6"));
}

TEST(PushPullSchedulerTest, RefusesBuffersThatDoNotMatchTheStore) {
  ManualStore store(kEnds);
  std::vector<float> short_buffer(399), right(400);
  EXPECT_EQ(PushPullScheduler::Create({}, &store, short_buffer, absl::MakeSpan(right), 0)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PushPullScheduler::Create(Buckets(-1), &store, right, absl::MakeSpan(right), 0)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ps::worker
