#ifndef PS_COMMON_PROCESS_TUNING_H_
#define PS_COMMON_PROCESS_TUNING_H_

#include <signal.h>

namespace ps {

// Process-wide settings for the daemons and the benchmarks, which keep gigabytes
// moving through gRPC and many threads.

// The allocator of every binary that links this library is tcmalloc
// (gperftools, Debian's libtcmalloc-minimal4), not glibc malloc: received
// gRPC bytes land in read slices of up to 4 MiB, allocated on gRPC's
// threads and freed on others, and glibc's per-thread arenas kept growing
// their heaps (64 KiB at a time, 270 MB of fresh heap in 3 rounds of
// tests/wire_benchmark's 64 MiB model) instead of reusing what was freed:
// the servers faulted 2,700-7,300 pages a round receiving a push of 16,384
// pages, the worker up to 11,000 receiving a pull, whatever the mallopt
// settings (one arena, or two, or four, a large top pad, no trimming).
// Under tcmalloc the same rounds fault 0-700 pages (median 15-670 pushing,
// 1-70 pulling; jemalloc 5.3, even without decay, faulted 5,000-9,000).
// TuneMallocForLargeMessages keeps freed memory in tcmalloc's page heap
// rather than handing it back to the kernel (release rate 0), so a step's
// buffers come back as the next step's. Call once at the start of main(),
// before threads start; process-wide.
void TuneMallocForLargeMessages();

// Turns off abseil's mutex deadlock detection, which Debian's libabsl (built
// without NDEBUG) leaves on: every Mutex::Lock then records the locks the
// thread holds in a process-wide graph under a global lock, on the data
// path's hottest locks (a chunk's, the scheduler's, gRPC callbacks'). The
// daemons and benchmarks call this; the tests keep the detection. Call once
// at the start of main(), before threads start.
void DisableMutexDeadlockDetection();

// Blocks SIGINT and SIGTERM in the calling thread, and so in every thread it
// starts later (they inherit the mask), and returns the set, for one thread
// to take them with sigwait. The daemons never take them in a handler:
// Debian 12's oneDNN 2.6 JIT GEMM kernels point rsp into the heap while
// they run, and a signal delivered to such a thread has the kernel write
// its frame there, corrupting the heap (oneDNN issue 4845, fixed in 3.11;
// seen in 3 of 70 runs of worker_loss_test's SIGTERM case). Call before
// any thread starts.
sigset_t BlockStopSignals();

}  // namespace ps

#endif  // PS_COMMON_PROCESS_TUNING_H_
