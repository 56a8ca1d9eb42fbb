#include "common/thread_stack.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <unistd.h>

#include <cstdint>

namespace ps {
namespace {

int AddStaticTls(dl_phdr_info* info, size_t /*size*/, void* data) {
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& header = info->dlpi_phdr[i];
    if (header.p_type != PT_TLS) continue;
    // Each block starts at a multiple of its alignment: up to align - 1
    // bytes of padding before it.
    const size_t align = header.p_align > 0 ? header.p_align : 1;
    *static_cast<size_t*>(data) += header.p_memsz + align - 1;
  }
  return 0;
}

}  // namespace

size_t StaticTlsBytes() {
  size_t bytes = kStaticTlsSurplus;
  dl_iterate_phdr(AddStaticTls, &bytes);
  return bytes;
}

size_t StackSizeWithStaticTls(size_t requested) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t tls = StaticTlsBytes();
  if (requested > SIZE_MAX - tls - page) return requested;  // glibc refuses it anyway
  return (requested + tls + page - 1) / page * page;
}

}  // namespace ps

// Interposes glibc's pthread_attr_setstacksize for the whole process (see
// thread_stack.h). The executable exports it (linkopts in common/BUILD).
extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t stacksize) noexcept {
  using SetStackSize = int (*)(pthread_attr_t*, size_t);
  static const SetStackSize glibc =
      reinterpret_cast<SetStackSize>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  if (glibc == nullptr) return ENOSYS;
  if (stacksize < static_cast<size_t>(PTHREAD_STACK_MIN)) return glibc(attr, stacksize);
  return glibc(attr, ps::StackSizeWithStaticTls(stacksize));
}
