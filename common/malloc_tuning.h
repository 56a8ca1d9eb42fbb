#ifndef PS_COMMON_MALLOC_TUNING_H_
#define PS_COMMON_MALLOC_TUNING_H_

namespace ps {

// Keeps glibc malloc from serving large blocks with fresh mmap()s. Every
// gRPC message carries up to 4 MiB of tensor data, and by default glibc maps
// (and zero-fills, page by page) each such buffer anew and unmaps it on
// free: on loopback that page-fault traffic cost more than the copies. With
// these settings blocks up to 256 MiB come from the heap and are reused.
// Call once at the start of main(), before threads start; process-wide.
void TuneMallocForLargeMessages();

}  // namespace ps

#endif  // PS_COMMON_MALLOC_TUNING_H_
