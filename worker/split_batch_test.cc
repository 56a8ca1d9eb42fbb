#include "worker/split_batch.h"

#include "gtest/gtest.h"

namespace ps::worker {
namespace {

TEST(SplitEvenlyTest, CoversTheRangeInOrderWithSizesWithinOne) {
  for (int64_t n : {0, 1, 2, 7, 256, 257}) {
    for (int parts : {1, 2, 3, 4}) {
      int64_t next = 0, min_size = n, max_size = 0;
      for (int i = 0; i < parts; ++i) {
        const Part p = SplitEvenly(n, parts, i);
        EXPECT_EQ(p.begin, next) << n << "/" << parts;
        next += p.size;
        min_size = std::min(min_size, p.size);
        max_size = std::max(max_size, p.size);
      }
      EXPECT_EQ(next, n);
      EXPECT_LE(max_size - min_size, 1);
    }
  }
  EXPECT_EQ(SplitEvenly(7, 3, 0).size, 3);
  EXPECT_EQ(SplitEvenly(7, 3, 2).begin, 5);
}

}  // namespace
}  // namespace ps::worker
