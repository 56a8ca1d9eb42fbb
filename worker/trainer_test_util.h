#ifndef PS_WORKER_TRAINER_TEST_UTIL_H_
#define PS_WORKER_TRAINER_TEST_UTIL_H_

// Fixtures shared by the trainer's CPU and GPU tests.

#include <cstdint>
#include <utility>

#include "common/optimizer/optimizer.h"
#include "gtest/gtest.h"
#include "worker/data/synthetic.h"

namespace ps::worker::testing {

// The default synthetic task with `size` samples; fails the test (and returns
// an empty dataset) if it cannot be made.
inline data::Dataset SyntheticDataset(int64_t size) {
  data::SyntheticOptions options;
  options.size = size;
  auto dataset = data::MakeSyntheticDataset(options);
  EXPECT_TRUE(dataset.ok()) << dataset.status();
  return dataset.ok() ? std::move(dataset).value() : data::Dataset();
}

// SGD with momentum and weight decay on, so both are exercised.
inline OptimizerOptions MomentumSgd() {
  OptimizerOptions o;
  o.sgd.lr = 0.1f;
  o.sgd.momentum = 0.9f;
  o.sgd.weight_decay = 1e-3f;
  return o;
}

}  // namespace ps::worker::testing

#endif  // PS_WORKER_TRAINER_TEST_UTIL_H_
