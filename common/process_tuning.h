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
// tests/wire_benchmark's 64 MiB model) instead of reusing what was freed,
// whatever the mallopt settings (one arena, two, four, a large top pad, no
// trimming). 15 interleaved runs of that benchmark, the median of each
// run's faults per round of 16,384 pages each way: glibc 0-6,978 (median
// 2,882) receiving pushes and 0-5,004 (748) receiving pulls; tcmalloc
// 0-2,204 (33) and 0-432 (2): its heap grows to its high-water mark in
// the first rounds, then only when more bytes are in flight than before.
// jemalloc 5.3, even without decay, faulted 7,353-8,969 and 5,447-8,435.
// At 1.7 us a fault here, glibc's cost a 64 MiB push about 5 ms.
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
