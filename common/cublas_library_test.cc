// cuBLAS loaded on demand: not by linking this library or starting a
// program, only by Cublas(), and then with every entry point the project
// calls. Needs the CUDA toolkit's libraries, not a GPU or a driver.

#include <dlfcn.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

#ifdef PS_WITH_CUDA
#include "common/cublas_library.h"
#endif

namespace ps {
namespace {

#ifdef PS_WITH_CUDA
bool CublasInProcess() {
  const std::string name = absl::StrCat("libcublas.so.", CUBLAS_VER_MAJOR);
  void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (handle != nullptr) dlclose(handle);
  return handle != nullptr;
}

TEST(CublasLibraryTest, LoadsOnFirstUseWithEveryEntryPoint) {
  EXPECT_EQ(CublasIfLoaded(), nullptr);
  EXPECT_FALSE(CublasInProcess()) << "cuBLAS was loaded at start: the program links it";
  absl::StatusOr<const CublasLibrary*> cublas = Cublas();
  ASSERT_TRUE(cublas.ok()) << cublas.status();
  EXPECT_TRUE(CublasInProcess());
  EXPECT_EQ(CublasIfLoaded(), *cublas);
  const CublasLibrary& c = **cublas;
  EXPECT_NE(c.create, nullptr);
  EXPECT_NE(c.destroy, nullptr);
  EXPECT_NE(c.set_stream, nullptr);
  EXPECT_NE(c.sgemm, nullptr);
  EXPECT_NE(c.sgemm_strided_batched, nullptr);
  EXPECT_NE(c.sscal, nullptr);
  EXPECT_STREQ(c.status_name(CUBLAS_STATUS_NOT_INITIALIZED), "CUBLAS_STATUS_NOT_INITIALIZED");
  // Loaded once: the same table again.
  absl::StatusOr<const CublasLibrary*> again = Cublas();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *cublas);
}
#else
TEST(CublasLibraryTest, LoadsOnFirstUseWithEveryEntryPoint) {
  GTEST_SKIP() << "CPU-only build: no cuBLAS";
}
#endif

}  // namespace
}  // namespace ps
