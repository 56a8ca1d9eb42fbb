#include "worker/push_pull_scheduler.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ps::worker {

PushPullScheduler::PushPullScheduler(const PushPullOptions& options, ParameterStore* store,
                                     absl::Span<const float> gradients, absl::Span<float> params,
                                     int64_t version)
    : options_(options),
      store_(store),
      gradients_(gradients),
      params_(params),
      version_(version) {}

absl::StatusOr<std::unique_ptr<PushPullScheduler>> PushPullScheduler::Create(
    const PushPullOptions& options, ParameterStore* store, absl::Span<const float> gradients,
    absl::Span<float> params, int64_t version, absl::Span<const int64_t> layer_begins) {
  if (store == nullptr) return absl::InvalidArgumentError("no parameter store");
  if (options.bucket_bytes < 0 || options.max_bytes_in_flight < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bucket bytes (", options.bucket_bytes, ") and bytes in flight (",
        options.max_bytes_in_flight, ") must not be negative"));
  }
  const std::vector<int64_t> ends = store->SegmentEnds();
  const std::vector<int> streams = store->SegmentStreams();
  const int64_t size = ends.empty() ? 0 : ends.back();
  if (streams.size() != ends.size() ||
      std::any_of(streams.begin(), streams.end(), [](int s) { return s < 0; })) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the store names ", streams.size(), " segments' streams for ", ends.size(),
        " segments, or a negative stream"));
  }
  if (static_cast<int64_t>(gradients.size()) != size ||
      static_cast<int64_t>(params.size()) != size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "buffers of ", gradients.size(), " and ", params.size(),
        " elements for a store of ", size, " (registered?)"));
  }
  for (size_t i = 0; i < layer_begins.size(); ++i) {
    if (layer_begins[i] < 0 || layer_begins[i] >= std::max<int64_t>(size, 1) ||
        (i > 0 && layer_begins[i] <= layer_begins[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layer ", i, " begins at offset ", layer_begins[i],
          ": the layers' offsets must ascend within the ", size, " parameters"));
    }
  }
  std::unique_ptr<PushPullScheduler> s(
      new PushPullScheduler(options, store, gradients, params, version));
  int64_t begin = 0;
  int first = 0;
  const auto bytes = [](int64_t from, int64_t to) {
    return (to - from) * static_cast<int64_t>(sizeof(float));
  };
  const int num_segments = static_cast<int>(ends.size());
  for (int seg = 0; seg < num_segments; ++seg) {
    const int64_t seg_begin = seg == 0 ? 0 : ends[seg - 1];
    if (first < seg && bytes(seg_begin, ends[seg]) >= options.bucket_bytes) {
      // A full segment after small ones: they close their own bucket.
      s->buckets_.push_back({begin, seg_begin, first, seg, streams[first]});
      begin = seg_begin;
      first = seg;
    }
    // A bucket travels on one stream: the last segment of a stream closes it.
    const bool last = seg + 1 == num_segments || streams[seg + 1] != streams[seg];
    if (!last && bytes(begin, ends[seg]) < options.bucket_bytes) continue;
    s->buckets_.push_back({begin, ends[seg], first, seg + 1, streams[seg]});
    begin = ends[seg];
    first = seg + 1;
  }
  const int num_streams = streams.empty() ? 0 : *std::max_element(streams.begin(), streams.end()) + 1;
  s->OrderBuckets(layer_begins);
  absl::MutexLock lock(&s->mu_);
  s->push_bytes_in_flight_.assign(num_streams, 0);
  s->pull_bytes_in_flight_.assign(num_streams, 0);
  s->state_.assign(s->buckets_.size(), State::kHeld);
  // Before the first iteration every bucket counts as pushed and pulled:
  // it holds `version`.
  s->pushed_.assign(s->buckets_.size(), true);
  s->iteration_of_.assign(s->buckets_.size(), version - 1);
  s->staged_.assign(s->buckets_.size(), false);
  if (options.stage_early_pulls) s->staging_.resize(size);
  return s;
}

void PushPullScheduler::OrderBuckets(absl::Span<const int64_t> layer_begins) {
  // Per bucket, the layer its first element belongs to (without layers:
  // its own index, so the front bucket first).
  std::vector<int64_t> layer(buckets_.size());
  for (size_t b = 0; b < buckets_.size(); ++b) {
    layer[b] = layer_begins.empty()
                   ? static_cast<int64_t>(b)
                   : std::upper_bound(layer_begins.begin(), layer_begins.end(),
                                      buckets_[b].begin) -
                         layer_begins.begin();
  }
  priority_order_.resize(buckets_.size());
  for (size_t b = 0; b < buckets_.size(); ++b) priority_order_[b] = static_cast<int>(b);
  std::sort(priority_order_.begin(), priority_order_.end(), [&](int x, int y) {
    if (layer[x] != layer[y]) return layer[x] < layer[y];
    return x > y;  // within a layer, from its last bucket
  });
}

PushPullScheduler::~PushPullScheduler() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
  mu_.Await(absl::Condition(
      +[](int* calls) { return *calls == 0; }, &calls_in_flight_));
}

int64_t PushPullScheduler::version() const {
  absl::MutexLock lock(&mu_);
  return version_;
}

absl::Status PushPullScheduler::BeginIteration(int64_t num_samples) {
  absl::MutexLock lock(&mu_);
  if (!error_.ok()) return error_;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (!pushed_[b]) {
      return absl::FailedPreconditionError(absl::StrCat(
          "iteration ", version_, " begins before bucket ", b, " (elements [",
          buckets_[b].begin, ", ", buckets_[b].end, ")) of iteration ", version_ - 1,
          " was pushed"));
    }
  }
  std::fill(pushed_.begin(), pushed_.end(), false);
  num_samples_ = num_samples;
  ++version_;
  released_from_ = std::numeric_limits<int64_t>::max();
  return absl::OkStatus();
}

void PushPullScheduler::QueuePushesLocked(int64_t offset) {
  // Buckets are in offset order: walk down from the back.
  for (int b = static_cast<int>(buckets_.size()); b-- > 0;) {
    if (buckets_[b].begin < offset) break;
    if (pushed_[b]) continue;
    if (state_[b] != State::kHeld && error_.ok()) {
      // Its previous pull is still out: the forward did not wait for it.
      error_ = absl::FailedPreconditionError(absl::StrCat(
          "bucket ", b, "'s gradient is ready before its parameters of version ", version_ - 1,
          " arrived"));
    }
    pushed_[b] = true;
    iteration_of_[b] = version_ - 1;
    state_[b] = State::kPushQueued;
  }
}

void PushPullScheduler::GradientsReadyFrom(int64_t offset) {
  std::vector<int> copy;
  {
    absl::MutexLock lock(&mu_);
    QueuePushesLocked(offset);
    released_from_ = std::min(released_from_, offset);
    // Staged pulls wholly above the offset that have landed are copied in
    // now; those still in flight, as they land (OnDone).
    for (int b = static_cast<int>(buckets_.size()); b-- > 0;) {
      if (buckets_[b].begin < offset) break;
      if (state_[b] == State::kStaged) {
        state_[b] = State::kCopying;
        copy.push_back(b);
      }
    }
  }
  CopyStaged(copy);
  Pump();
}

void PushPullScheduler::CopyStaged(const std::vector<int>& buckets) {
  if (buckets.empty()) return;
  for (int b : buckets) {
    const Bucket& bucket = buckets_[b];
    std::copy(staging_.begin() + bucket.begin, staging_.begin() + bucket.end,
              params_.begin() + bucket.begin);
  }
  absl::MutexLock lock(&mu_);
  for (int b : buckets) {
    state_[b] = State::kHeld;
    staged_[b] = false;
  }
}

bool PushPullScheduler::PullHeldLocked(int b) const {
  return iteration_of_[b] == version_ - 1 && buckets_[b].begin < released_from_;
}

void PushPullScheduler::EarlyGradientsFrom(int64_t offset) {
  {
    absl::MutexLock lock(&mu_);
    QueuePushesLocked(offset);
  }
  Pump();
}

PushPullScheduler::Operation PushPullScheduler::NextLocked() {
  if (!error_.ok() || stopping_) return {};
  const int64_t bound = options_.max_bytes_in_flight;
  auto fits = [bound](int64_t in_flight, int64_t bytes) {
    return bound == 0 || in_flight == 0 || in_flight + bytes <= bound;
  };
  // Pushes first, then pulls; within each, in priority order, each stream
  // within its own bound.
  std::vector<bool>& full = full_streams_;
  for (int pass = 0; pass < 2; ++pass) {
    const bool push = pass == 0;
    full.assign(push_bytes_in_flight_.size(), false);
    for (const int b : priority_order_) {
      if (state_[b] != (push ? State::kPushQueued : State::kPullQueued)) continue;
      const int stream = buckets_[b].stream;
      if (full[stream]) continue;
      // A held pull waits, or with staging lands aside.
      const bool early = !push && PullHeldLocked(b);
      if (early && !options_.stage_early_pulls) continue;
      int64_t& in_flight = push ? push_bytes_in_flight_[stream] : pull_bytes_in_flight_[stream];
      if (!fits(in_flight, buckets_[b].bytes())) {
        full[stream] = true;  // nothing behind it on its stream jumps the queue
        continue;
      }
      in_flight += buckets_[b].bytes();
      state_[b] = push ? State::kPushing : State::kPulling;
      if (early) staged_[b] = true;
      ++calls_in_flight_;
      return {b, push};
    }
  }
  return {};
}

void PushPullScheduler::Pump() {
  for (;;) {
    Operation op;
    int64_t iteration = 0, samples = 0;
    bool staged = false;
    {
      absl::MutexLock lock(&mu_);
      op = NextLocked();
      if (op.bucket < 0) return;
      iteration = iteration_of_[op.bucket];
      samples = num_samples_;
      staged = staged_[op.bucket];
    }
    const Bucket& bucket = buckets_[op.bucket];
    // The store may run `done` inside the call (a local store): OnDone then
    // pumps again, from here.
    if (op.push) {
      store_->PushSegments(iteration, samples, bucket.first_segment, bucket.last_segment,
                           gradients_, [this, op](absl::Status s) { OnDone(op, std::move(s)); });
    } else {
      store_->PullSegments(iteration + 1, bucket.first_segment, bucket.last_segment,
                           staged ? absl::MakeSpan(staging_) : params_,
                           [this, op](absl::Status s) { OnDone(op, std::move(s)); });
    }
  }
}

void PushPullScheduler::OnDone(Operation op, absl::Status status) {
  std::vector<int> copy;
  {
    absl::MutexLock lock(&mu_);
    const int b = op.bucket;
    const int64_t bytes = buckets_[b].bytes();
    if (op.push) {
      push_bytes_in_flight_[buckets_[b].stream] -= bytes;
      state_[b] = State::kPullQueued;
    } else {
      pull_bytes_in_flight_[buckets_[b].stream] -= bytes;
      state_[b] = State::kHeld;
      if (staged_[b] && status.ok()) {
        if (PullHeldLocked(b)) {
          state_[b] = State::kStaged;
        } else {
          state_[b] = State::kCopying;
          copy.push_back(b);
        }
      } else {
        staged_[b] = false;
      }
    }
    if (!status.ok() && error_.ok()) error_ = std::move(status);
  }
  CopyStaged(copy);
  Pump();
  // Last: the destructor waits for this, so nothing here may touch the
  // scheduler after it.
  absl::MutexLock lock(&mu_);
  --calls_in_flight_;
}

bool PushPullScheduler::HasParametersLocked(int64_t begin, int64_t end) const {
  if (!error_.ok()) return true;
  // The buckets meeting [begin, end): from the first that ends after begin.
  auto b = std::upper_bound(buckets_.begin(), buckets_.end(), begin,
                            [](int64_t offset, const Bucket& bucket) { return offset < bucket.end; });
  for (; b != buckets_.end() && b->begin < end; ++b) {
    if (state_[b - buckets_.begin()] != State::kHeld) return false;
  }
  return true;
}

bool PushPullScheduler::HasParameters(int64_t begin, int64_t end) const {
  absl::MutexLock lock(&mu_);
  return HasParametersLocked(begin, end);
}

absl::Status PushPullScheduler::AwaitParameters(int64_t begin, int64_t end) {
  absl::MutexLock lock(&mu_);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return HasParametersLocked(begin, end); };
  mu_.Await(absl::Condition(&ready));
  return error_;
}

absl::Status PushPullScheduler::AwaitNoBucketIn(std::initializer_list<State> states) {
  absl::MutexLock lock(&mu_);
  auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!error_.ok()) return true;
    for (State s : state_) {
      if (std::find(states.begin(), states.end(), s) != states.end()) return false;
    }
    return true;
  };
  mu_.Await(absl::Condition(&done));
  return error_;
}

absl::Status PushPullScheduler::AwaitPushes() {
  return AwaitNoBucketIn({State::kPushQueued, State::kPushing});
}

absl::Status PushPullScheduler::AwaitAll() {
  return AwaitNoBucketIn({State::kPushQueued, State::kPushing, State::kPullQueued,
                          State::kPulling, State::kStaged, State::kCopying});
}

}  // namespace ps::worker
