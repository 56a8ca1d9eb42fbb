#ifndef PS_COMMON_PROCESS_TUNING_H_
#define PS_COMMON_PROCESS_TUNING_H_

#include <signal.h>

namespace ps {

// Process-wide settings for the daemons and the benchmarks, which keep gigabytes
// moving through gRPC and many threads.

// Keeps glibc malloc from serving large blocks with fresh mmap()s. Every
// gRPC message carries up to 4 MiB of tensor data, and by default glibc maps
// (and zero-fills, page by page) each such buffer anew and unmaps it on
// free: on loopback that page-fault traffic cost more than the copies. With
// these settings blocks up to 256 MiB come from the heap and are reused.
// glibc's thread arenas still fault fresh pages in: tests/wire_benchmark
// (64 MiB model) faults 57 K pages more than with one arena before its
// first round, then 2.6 K (10 MB) a round more, its RSS growing 3.4 MB a
// round. One arena for all threads (M_ARENA_MAX=1) removed both, but behind
// a shaped link the server then stalled in 3 runs of 6 (MLP-20M: 1.8 s a
// step instead of 1.45 s; its longest pull 12 ms instead of 0.7), as if
// its threads queued on the one malloc lock, so the arenas stay.
// Call once at the start of main(), before threads start; process-wide.
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
