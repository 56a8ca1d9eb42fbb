// The stack-size interposer, in a binary that links what the worker links
// (cuBLAS, cuBLASLt, cudart, NCCL and oneDNN in the CUDA build; oneDNN
// alone with --config=cpu_only): glibc alone refuses civetweb's 102,400-byte
// threads when the static TLS outgrows them, and with the interposer every
// such thread starts with the stack it asked for.

#include "common/thread_stack.h"

#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <pthread.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

// civetweb 1.15's fixed thread stack (Debian's libcivetweb1 passes 0x19000).
constexpr size_t kCivetwebStack = 102400;

// glibc's own static TLS block size (a GLIBC_PRIVATE function of ld.so),
// or 0 when it is not there.
size_t GlibcStaticTls() {
  using Info = void (*)(size_t*, size_t*);
  const auto info = reinterpret_cast<Info>(dlsym(RTLD_DEFAULT, "_dl_get_tls_static_info"));
  if (info == nullptr) return 0;
  size_t size = 0, align = 0;
  info(&size, &align);
  return size;
}

// libc's pthread_attr_setstacksize, past the interposer.
int GlibcSetStackSize(pthread_attr_t* attr, size_t size) {
  void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  using SetStackSize = int (*)(pthread_attr_t*, size_t);
  const auto set = reinterpret_cast<SetStackSize>(dlsym(libc, "pthread_attr_setstacksize"));
  return set == nullptr ? ENOSYS : set(attr, size);
}

bool Loaded(const std::string& name) {
  struct Find {
    const std::string* name;
    bool found = false;
  } find{&name};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto* f = static_cast<Find*>(data);
        f->found |= std::string(info->dlpi_name).find(*f->name) != std::string::npos;
        return 0;
      },
      &find);
  return find.found;
}

// Bytes of stack below a thread's first frame, down to its guard page.
void* MeasureUsableStack(void* out) {
  pthread_attr_t attr;
  pthread_getattr_np(pthread_self(), &attr);
  void* low = nullptr;
  size_t size = 0, guard = 0;
  pthread_attr_getstack(&attr, &low, &size);
  pthread_attr_getguardsize(&attr, &guard);
  pthread_attr_destroy(&attr);
  char here = 0;
  *static_cast<size_t*>(out) = static_cast<size_t>(&here - static_cast<char*>(low)) - guard;
  return nullptr;
}

TEST(ThreadStackTest, TheEstimateCoversGlibcsStaticTls) {
  const size_t glibc = GlibcStaticTls();
  std::printf("static TLS: estimate %zu bytes, glibc's block %zu bytes\n", StaticTlsBytes(), glibc);
  if (glibc == 0) GTEST_SKIP() << "no _dl_get_tls_static_info in this glibc";
  EXPECT_GE(StaticTlsBytes(), glibc);
}

TEST(ThreadStackTest, GlibcAloneRefusesCivetwebsStackWhenTheTlsOutgrowsIt) {
#ifdef PS_WITH_CUDA
  ASSERT_TRUE(Loaded("libcublasLt.so")) << "the CUDA build should load cuBLASLt";
#endif
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  ASSERT_EQ(GlibcSetStackSize(&attr, kCivetwebStack), 0);
  pthread_t thread;
  size_t usable = 0;
  const int created = pthread_create(&thread, &attr, MeasureUsableStack, &usable);
  pthread_attr_destroy(&attr);
  if (created == 0) pthread_join(thread, nullptr);
  std::printf("glibc alone, %zu-byte stack: %s\n", kCivetwebStack,
              created == 0 ? absl::StrCat("started, ", usable, " bytes usable").c_str()
                           : std::strerror(created));
  const size_t tls = GlibcStaticTls();
  if (tls == 0) GTEST_SKIP() << "no _dl_get_tls_static_info in this glibc";
#ifdef PS_WITH_CUDA
  EXPECT_GT(tls, kCivetwebStack);
#endif
  if (tls > kCivetwebStack) {
    EXPECT_EQ(created, EINVAL);
  }
}

TEST(ThreadStackTest, ThreadsGetTheStackTheyAskForOnTopOfTheTls) {
  for (const size_t requested : {size_t{65536}, kCivetwebStack, size_t{1} << 20}) {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    ASSERT_EQ(pthread_attr_setstacksize(&attr, requested), 0);
    size_t given = 0;
    pthread_attr_getstacksize(&attr, &given);
    EXPECT_GE(given, requested + GlibcStaticTls());
    pthread_t thread;
    size_t usable = 0;
    ASSERT_EQ(pthread_create(&thread, &attr, MeasureUsableStack, &usable), 0)
        << requested << " bytes asked, " << given << " given";
    pthread_join(thread, nullptr);
    pthread_attr_destroy(&attr);
    std::printf("asked %zu bytes of stack: set %zu, %zu usable in the thread\n", requested, given,
                usable);
    // A page for the thread's first frames.
    EXPECT_GE(usable + 4096, requested);
  }
}

TEST(ThreadStackTest, GlibcsMinimumStillHolds) {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  EXPECT_EQ(pthread_attr_setstacksize(&attr, 1024), EINVAL);
  pthread_attr_destroy(&attr);
}

}  // namespace
}  // namespace ps
