#ifndef PS_WORKER_FAKE_STORES_H_
#define PS_WORKER_FAKE_STORES_H_

// Parameter stores for tests of what drives a store asynchronously (the
// push/pull scheduler, the overlaps): only SegmentEnds and the *Segments
// calls do anything; Register answers an empty registration and the
// blocking calls are kUnimplemented.

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "worker/parameter_store.h"

namespace ps::worker::testing {

// The segments' ends are fixed at construction; subclasses say what the
// asynchronous calls do.
class AsyncOnlyStore : public ParameterStore {
 public:
  explicit AsyncOnlyStore(std::vector<int64_t> ends) : ends_(std::move(ends)) {}

  absl::StatusOr<Registration> Register(const std::vector<ParamSpec>&,
                                        absl::Span<const float>) override {
    return Registration{};
  }
  absl::Status Push(int64_t, int64_t, absl::Span<const float>) override {
    return absl::UnimplementedError("blocking push");
  }
  absl::Status WaitForVersion(int64_t) override { return absl::UnimplementedError("wait"); }
  absl::StatusOr<int64_t> Pull(int64_t, absl::Span<float>) override {
    return absl::UnimplementedError("blocking pull");
  }
  std::vector<int64_t> SegmentEnds() const override { return ends_; }

 protected:
  // Segment `segment`'s first element.
  int64_t Begin(int segment) const { return segment == 0 ? 0 : ends_[segment - 1]; }
  const std::vector<int64_t>& ends() const { return ends_; }

 private:
  const std::vector<int64_t> ends_;
};

// Completes every call at once: a push keeps a copy of the segments it
// read, a pull writes the version it brings into its segments.
class RecordingStore final : public AsyncOnlyStore {
 public:
  struct Pushed {
    int first = 0, last = 0;    // the segments
    std::vector<float> values;  // their gradients when pushed
  };

  using AsyncOnlyStore::AsyncOnlyStore;

  void PushSegments(int64_t, int64_t, int first, int last, absl::Span<const float> gradients,
                    Done done) override {
    {
      absl::MutexLock lock(&mu_);
      pushed_.push_back({first, last,
                         std::vector<float>(gradients.begin() + Begin(first),
                                            gradients.begin() + ends()[last - 1])});
    }
    done(absl::OkStatus());
  }
  void PullSegments(int64_t version, int first, int last, absl::Span<float> params,
                    Done done) override {
    for (int64_t i = Begin(first); i < ends()[last - 1]; ++i) {
      params[i] = static_cast<float>(version);
    }
    done(absl::OkStatus());
  }

  // The pushes so far, in the order they were made.
  std::vector<Pushed> pushed() {
    absl::MutexLock lock(&mu_);
    return pushed_;
  }

 private:
  absl::Mutex mu_;
  std::vector<Pushed> pushed_ ABSL_GUARDED_BY(mu_);
};

// Hands every call to `inner` (which outlives it): a base for stores that
// watch or change a few calls of a real one.
class ForwardingStore : public ParameterStore {
 public:
  explicit ForwardingStore(ParameterStore* inner) : inner_(inner) {}

  absl::StatusOr<Registration> Register(const std::vector<ParamSpec>& signature,
                                        absl::Span<const float> proposed) override {
    return inner_->Register(signature, proposed);
  }
  absl::Status Push(int64_t iteration, int64_t num_samples,
                    absl::Span<const float> gradients) override {
    return inner_->Push(iteration, num_samples, gradients);
  }
  absl::Status WaitForVersion(int64_t version) override { return inner_->WaitForVersion(version); }
  absl::StatusOr<int64_t> Pull(int64_t version, absl::Span<float> params) override {
    return inner_->Pull(version, params);
  }
  std::vector<int64_t> SegmentEnds() const override { return inner_->SegmentEnds(); }
  std::vector<int> SegmentStreams() const override { return inner_->SegmentStreams(); }
  void PushSegments(int64_t iteration, int64_t num_samples, int first, int last,
                    absl::Span<const float> gradients, Done done) override {
    inner_->PushSegments(iteration, num_samples, first, last, gradients, std::move(done));
  }
  void PullSegments(int64_t version, int first, int last, absl::Span<float> params,
                    Done done) override {
    inner_->PullSegments(version, first, last, params, std::move(done));
  }
  absl::Status BindBuffers(absl::Span<const float> gradients, absl::Span<float> params) override {
    return inner_->BindBuffers(gradients, params);
  }

 protected:
  ParameterStore* inner() const { return inner_; }

 private:
  ParameterStore* const inner_;
};

}  // namespace ps::worker::testing

#endif  // PS_WORKER_FAKE_STORES_H_
