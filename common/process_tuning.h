#ifndef PS_COMMON_PROCESS_TUNING_H_
#define PS_COMMON_PROCESS_TUNING_H_

namespace ps {

// Process-wide settings for the daemons and the benchmarks, which keep gigabytes
// moving through gRPC and many threads.

// Keeps glibc malloc from serving large blocks with fresh pages. Every
// gRPC message carries up to 4 MiB of tensor data, and by default glibc maps
// (and zero-fills, page by page) each such buffer anew and unmaps it on
// free: on loopback that page-fault traffic cost more than the copies. With
// these settings blocks up to 256 MiB come from the heap and are reused.
// The heap is the main arena alone: a thread arena grows in 64 MiB heaps
// mapped for it, and glibc unmaps a whole heap as soon as it is free again,
// whatever the trim threshold, so each round of a model's messages through
// gRPC's threads faulted a heap's worth of fresh pages in again (9 % of the
// CPU of tests/wire_benchmark --model_mib=64; with one arena 0.8 %, and the
// benchmark's CPU time 12 % less). Threads then share one malloc lock, which
// costs little at the few thousand large messages a second a server sees.
// Call once at the start of main(), before threads start; process-wide.
void TuneMallocForLargeMessages();

// Turns off abseil's mutex deadlock detection, which Debian's libabsl (built
// without NDEBUG) leaves on: every Mutex::Lock then records the locks the
// thread holds in a process-wide graph under a global lock, on the data
// path's hottest locks (a chunk's, the scheduler's, gRPC callbacks'). The
// daemons and benchmarks call this; the tests keep the detection. Call once
// at the start of main(), before threads start.
void DisableMutexDeadlockDetection();

}  // namespace ps

#endif  // PS_COMMON_PROCESS_TUNING_H_
