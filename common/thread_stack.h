#ifndef PS_COMMON_THREAD_STACK_H_
#define PS_COMMON_THREAD_STACK_H_

// Threads whose creator sets a stack size get that much stack on top of the
// static TLS, which glibc carves out of every new thread's stack.
//
// Why: Debian's libcivetweb 1.15 (prometheus-cpp's HTTP server) creates its
// threads with pthread_attr_setstacksize(102400), fixed at its build
// (CMake's CIVETWEB_THREAD_STACK_SIZE default). glibc 2.36 places each
// thread's static TLS block (the PT_TLS segments of every object loaded at
// start, plus a surplus) at the top of the thread's stack and fails
// pthread_create with EINVAL when the stack cannot hold it. A worker linking
// CUDA has 123,596 bytes of PT_TLS (cuBLASLt 94,240, cuBLAS 12,320, NCCL
// 12,288, cudart 4,096, the rest a few hundred: oneDNN 36, libgomp 136) and
// a static TLS block of 137,536 bytes (4096-byte alignment), more than
// civetweb's 102,400-byte stacks hold ("Cannot create first worker thread");
// 198,976 while the worker also linked OpenBLAS (61,440 of PT_TLS).
// A CPU-only worker's static TLS is a few KB; civetweb's threads start, but
// with that much less of the 100 KiB they asked for.
//
// How: linking this library (alwayslink; //common:metrics depends on it)
// defines pthread_attr_setstacksize in the executable and exports it, so
// every caller in the process (libcivetweb's versioned
// pthread_attr_setstacksize@GLIBC_2.34 reference included: an unversioned
// definition in the executable satisfies it) binds here; it asks glibc's
// own (dlsym(RTLD_NEXT)) for StackSizeWithStaticTls(requested). Requests
// below PTHREAD_STACK_MIN still get glibc's EINVAL. Threads created without
// a stack size (glibc's default, RLIMIT_STACK: 8 MiB) are untouched.

#include <cstddef>

namespace ps {

// Glibc's static TLS surplus (room for initial-exec TLS of objects dlopen'd
// later, and the block's own alignment), over-estimated: measured 4,048
// bytes above the PT_TLS sizes of a process without CUDA.
inline constexpr size_t kStaticTlsSurplus = 8192;

// An upper estimate of the static TLS glibc takes from each new thread's
// stack: every loaded object's PT_TLS size plus its alignment less one
// (dl_iterate_phdr), plus kStaticTlsSurplus. Thread-safe.
size_t StaticTlsBytes();

// `requested` + StaticTlsBytes(), rounded up to whole pages: the size that
// leaves a thread the `requested` bytes of stack its creator asked for.
size_t StackSizeWithStaticTls(size_t requested);

}  // namespace ps

#endif  // PS_COMMON_THREAD_STACK_H_
