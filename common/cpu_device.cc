#include "common/cpu_device.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ps {
namespace {

constexpr int64_t kAlignment = 64;

// Range of chunk `chunk` when [0, n) is cut into `chunks` near-equal parts.
void ChunkRange(int64_t n, int chunks, int chunk, int64_t* begin, int64_t* end) {
  const int64_t base = n / chunks;
  const int64_t extra = n % chunks;
  *begin = chunk * base + std::min<int64_t>(chunk, extra);
  *end = *begin + base + (chunk < extra ? 1 : 0);
}

// Set while this thread runs a part of a ParallelFor cut into several.
thread_local bool in_parallel_part = false;

// Runs fn(begin, end) as such a part.
void RunPart(const std::function<void(int64_t, int64_t)>& fn, int64_t begin, int64_t end) {
  const bool outer = in_parallel_part;
  in_parallel_part = true;
  fn(begin, end);
  in_parallel_part = outer;
}

}  // namespace

bool CpuDevice::InParallelPart() { return in_parallel_part; }

CpuDevice::CpuDevice(int index, int num_threads)
    : Device(DeviceType::kCpu, absl::StrCat("cpu:", index)),
      num_threads_(std::max(1, num_threads)) {
  for (int i = 1; i < num_threads_; ++i) {
    workers_.emplace_back([this, i] { WorkerLoop(i); });
  }
}

CpuDevice::~CpuDevice() {
  ReleaseScratch();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void CpuDevice::WorkerLoop(int worker) {
  int64_t seen_generation = 0;
  while (true) {
    const std::function<void(int64_t, int64_t)>* job;
    int64_t n;
    int chunks;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_ready_.wait(lock, [&] { return stopping_ || generation_ != seen_generation; });
      if (stopping_) return;
      seen_generation = generation_;
      job = job_;
      n = job_n_;
      chunks = job_chunks_;
    }
    if (worker < chunks) {
      int64_t begin, end;
      ChunkRange(n, chunks, worker, &begin, &end);
      RunPart(*job, begin, end);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) work_done_.notify_one();
    }
  }
}

void CpuDevice::ParallelFor(int64_t n, int64_t min_chunk,
                            const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  min_chunk = std::max<int64_t>(1, min_chunk);
  const int chunks =
      static_cast<int>(std::min<int64_t>(num_threads_, std::max<int64_t>(1, n / min_chunk)));
  if (chunks == 1) {
    fn(0, n);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    job_n_ = n;
    job_chunks_ = chunks;
    pending_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  work_ready_.notify_all();
  int64_t begin, end;
  ChunkRange(n, chunks, 0, &begin, &end);
  RunPart(fn, begin, end);
  std::unique_lock<std::mutex> lock(mu_);
  work_done_.wait(lock, [&] { return pending_ == 0; });
  job_ = nullptr;
}

absl::StatusOr<void*> CpuDevice::Allocate(int64_t bytes) {
  if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat("negative allocation ", bytes));
  if (bytes == 0) return nullptr;
  const int64_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  void* ptr = std::aligned_alloc(kAlignment, rounded);
  if (ptr == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat(name(), ": out of host memory allocating ", bytes, " bytes"));
  }
  return ptr;
}

void CpuDevice::Deallocate(void* ptr) { std::free(ptr); }

absl::Status CpuDevice::CopyOnDevice(void* dst, const void* src, int64_t bytes) {
  if (bytes > 0 && dst != src) std::memmove(dst, src, bytes);
  return absl::OkStatus();
}

absl::Status CpuDevice::Memzero(void* dst, int64_t bytes) {
  if (bytes > 0) std::memset(dst, 0, bytes);
  return absl::OkStatus();
}

absl::Status CpuDevice::DoCopyHostToDevice(void* dst, const void* src, int64_t bytes) {
  return CopyOnDevice(dst, src, bytes);
}

absl::Status CpuDevice::DoCopyDeviceToHost(void* dst, const void* src, int64_t bytes) {
  return CopyOnDevice(dst, src, bytes);
}

}  // namespace ps
