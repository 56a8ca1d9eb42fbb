#include "worker/split_batch.h"

#include <algorithm>

namespace ps::worker {

Part SplitEvenly(int64_t n, int parts, int index) {
  const int64_t base = n / parts;
  const int64_t extra = n % parts;
  Part p;
  p.begin = index * base + std::min<int64_t>(index, extra);
  p.size = base + (index < extra ? 1 : 0);
  return p;
}

}  // namespace ps::worker
