#include "worker/compute_replay.h"

#include "absl/strings/str_cat.h"

namespace ps::worker {

int64_t ComputeProfile::step_ns() const {
  int64_t total = 0;
  for (const Point& p : points) total += p.gap_ns;
  return total;
}

void ProfilingHooks::BeginPass() {
  current_.clear();
  last_ns_ = clock_->NowNanos();
}

void ProfilingHooks::Mark(ComputeProfile::Point::Kind kind, int64_t begin, int64_t end) {
  const int64_t now = clock_->NowNanos();
  ComputeProfile::Point p;
  p.kind = kind;
  p.begin = begin;
  p.end = end;
  p.gap_ns = now - last_ns_;
  last_ns_ = now;
  current_.push_back(p);
}

absl::Status ProfilingHooks::BeforeForward(int64_t begin, int64_t end) {
  Mark(ComputeProfile::Point::kNeedParameters, begin, end);
  return absl::OkStatus();
}

void ProfilingHooks::GradientsReady(int64_t begin, int64_t end) {
  Mark(ComputeProfile::Point::kGradientsEarly, begin, end);
}

void ProfilingHooks::AfterBackward(int64_t begin, int64_t end) {
  Mark(ComputeProfile::Point::kGradientsReady, begin, end);
}

absl::Status ProfilingHooks::EndPass() {
  Mark(ComputeProfile::Point::kEnd, 0, 0);
  if (passes_ == 0) {
    sum_ = current_;
  } else {
    if (current_.size() != sum_.size()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "pass ", passes_ + 1, " reached ", current_.size(), " points, the first ", sum_.size()));
    }
    for (size_t i = 0; i < sum_.size(); ++i) {
      if (current_[i].kind != sum_[i].kind || current_[i].begin != sum_[i].begin ||
          current_[i].end != sum_[i].end) {
        return absl::FailedPreconditionError(
            absl::StrCat("pass ", passes_ + 1, " differs from the first at point ", i));
      }
      sum_[i].gap_ns += current_[i].gap_ns;
    }
  }
  ++passes_;
  return absl::OkStatus();
}

ComputeProfile ProfilingHooks::profile() const {
  ComputeProfile out;
  out.points = sum_;
  out.passes = passes_;
  if (passes_ > 0) {
    for (ComputeProfile::Point& p : out.points) p.gap_ns /= passes_;
  }
  return out;
}

}  // namespace ps::worker
