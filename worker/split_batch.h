#ifndef PS_WORKER_SPLIT_BATCH_H_
#define PS_WORKER_SPLIT_BATCH_H_

#include <cstdint>

namespace ps::worker {

// A contiguous part [begin, begin + size) of a range.
struct Part {
  int64_t begin = 0;
  int64_t size = 0;
};

// Part `index` of `parts` contiguous parts of [0, n): the first n % parts
// parts get one element more, so sizes differ by at most one and the parts
// cover [0, n) in order. A global batch is cut this way into the workers'
// parts, and a worker's part into its devices' shards; parts may be empty
// when n < parts.
Part SplitEvenly(int64_t n, int parts, int index);

}  // namespace ps::worker

#endif  // PS_WORKER_SPLIT_BATCH_H_
