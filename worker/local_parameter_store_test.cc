#include "worker/local_parameter_store.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/parameter_server.h"
#include "server/parameter_server_testing.h"

namespace ps::worker {
namespace {

std::vector<ParamSpec> Signature() {
  return {{"fc.weight", {2, 2}, DType::kF32}, {"fc.bias", {2}, DType::kF32}};
}

TEST(LocalParameterStoreTest, StartsFromTheProposalAndAppliesSgd) {
  OptimizerOptions sgd;
  sgd.sgd.lr = 0.5f;
  auto store = LocalParameterStore::Create(sgd);
  ASSERT_TRUE(store.ok()) << store.status();
  const std::vector<float> proposal = {1, 2, 3, 4, 5, 6};
  auto reg = (*store)->Register(Signature(), proposal);
  ASSERT_TRUE(reg.ok()) << reg.status();
  EXPECT_EQ(reg->rank, 0);
  EXPECT_EQ(reg->num_workers, 1);
  EXPECT_EQ(reg->version, 0);
  std::vector<float> params(6);
  ASSERT_TRUE((*store)->Pull(0, absl::MakeSpan(params)).ok());
  EXPECT_EQ(params, proposal);

  // A gradient summed over 2 samples: the step is lr * grad / 2.
  ASSERT_TRUE((*store)->Push(0, 2, std::vector<float>{2, 2, 2, 2, 4, 4}).ok());
  ASSERT_TRUE((*store)->WaitForVersion(1).ok());
  auto version = (*store)->Pull(1, absl::MakeSpan(params));
  ASSERT_TRUE(version.ok());
  EXPECT_EQ(*version, 1);
  EXPECT_EQ(params, (std::vector<float>{0.5f, 1.5f, 2.5f, 3.5f, 4, 5}));
}

// One segment per tensor, each done inside its call: a tensor's new value
// can be pulled as soon as its push returns, before the other is pushed.
TEST(LocalParameterStoreTest, SegmentsAreTensorsPublishedAsSoonAsPushed) {
  OptimizerOptions sgd;
  sgd.sgd.lr = 0.5f;
  auto store = LocalParameterStore::Create(sgd);
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->Register(Signature(), {1, 2, 3, 4, 5, 6}).ok());
  EXPECT_EQ((*store)->SegmentEnds(), (std::vector<int64_t>{4, 6}));
  const std::vector<float> grad = {2, 2, 2, 2, 4, 4};
  std::vector<float> params(6, -1);
  absl::Status status = absl::UnknownError("not run");
  auto record = [&](absl::Status s) { status = std::move(s); };
  (*store)->PushSegments(0, 2, 1, 2, grad, record);  // fc.bias first
  ASSERT_TRUE(status.ok()) << status;
  (*store)->PullSegments(1, 1, 2, absl::MakeSpan(params), record);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(params, (std::vector<float>{-1, -1, -1, -1, 4, 5}));
  // fc.weight is still at version 0: its pull of version 1 cannot wait.
  (*store)->PullSegments(1, 0, 1, absl::MakeSpan(params), record);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  (*store)->PushSegments(0, 2, 0, 1, grad, record);
  ASSERT_TRUE(status.ok()) << status;
  (*store)->PullSegments(1, 0, 1, absl::MakeSpan(params), record);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(params, (std::vector<float>{0.5f, 1.5f, 2.5f, 3.5f, 4, 5}));
  (*store)->PushSegments(1, 2, 0, 3, grad, record);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
}

TEST(LocalParameterStoreTest, RefusesWhatWouldNeverComplete) {
  auto store = LocalParameterStore::Create(OptimizerOptions());
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->Register(Signature(), {1, 2, 3, 4, 5, 6}).ok());
  // With one worker, a version beyond the next one never comes.
  EXPECT_EQ((*store)->WaitForVersion(2).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*store)->Push(0, 1, std::vector<float>(4)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*store)->Push(3, 1, std::vector<float>(6)).code(),
            absl::StatusCode::kFailedPrecondition);
  std::vector<float> with_nan = {0, 0, 0, 0, 0, NAN};
  EXPECT_EQ((*store)->Push(0, 1, with_nan).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*store)->version(), 0);  // nothing applied
}

// The in-process store's versions are the trainer's parameters: it applies
// SGD and says so; the sum-only server's optimizer is refused.
TEST(LocalParameterStoreTest, AppliesSgdAndRefusesTheSumOnlyOptimizer) {
  auto store = LocalParameterStore::Create(OptimizerOptions());
  ASSERT_TRUE(store.ok());
  auto registration = (*store)->Register(Signature(), {1, 2, 3, 4, 5, 6});
  ASSERT_TRUE(registration.ok()) << registration.status();
  EXPECT_EQ(registration->optimizer, "sgd");
  OptimizerOptions none;
  none.kind = kMeanGradientOptimizer;
  const absl::Status refused = LocalParameterStore::Create(none).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("optimizer 'none' is the parameter server's"),
            absl::string_view::npos)
      << refused;
}

TEST(LocalParameterStoreTest, ProposalOfTheWrongSizeIsRefused) {
  auto store = LocalParameterStore::Create(OptimizerOptions());
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->Register(Signature(), {1, 2, 3}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LocalParameterStoreTest, EpochScheduleUsesTheStatedStepsPerEpoch) {
  OptimizerOptions sgd;
  sgd.sgd.lr = 1.f;
  sgd.schedule.unit = LrSchedule::Unit::kEpochs;
  sgd.schedule.step_size = 1;
  sgd.schedule.gamma = 0.5f;
  sgd.schedule.steps_per_epoch = 2;
  auto store = LocalParameterStore::Create(sgd);
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->Register(Signature(), std::vector<float>(6, 0.f)).ok());
  std::vector<float> params(6);
  for (int64_t it = 0; it < 3; ++it) {
    ASSERT_TRUE((*store)->Push(it, 1, std::vector<float>(6, 1.f)).ok());
  }
  ASSERT_TRUE((*store)->Pull(3, absl::MakeSpan(params)).ok());
  EXPECT_FLOAT_EQ(params[0], -2.5f);  // 1 + 1 in epoch 0, 0.5 in epoch 1
}

absl::Status PushSync(ParameterStore& store, int64_t iteration, int64_t samples, int first,
                      int last, absl::Span<const float> gradient) {
  return AwaitDone([&](ParameterStore::Done done) {
    store.PushSegments(iteration, samples, first, last, gradient, std::move(done));
  });
}
absl::Status PullSync(ParameterStore& store, int64_t version, int first, int last,
                      absl::Span<float> params) {
  return AwaitDone([&](ParameterStore::Done done) {
    store.PullSegments(version, first, last, params, std::move(done));
  });
}

// Bound to the caller's buffers the store keeps nothing of its own: the
// parameters are updated where they lie, from the gradients where they lie,
// and only when their pull comes (a layer may push its weight gradients
// while it still reads its weights).
TEST(LocalParameterStoreTest, BoundBuffersAreUpdatedInPlaceWhenPulled) {
  OptimizerOptions sgd;
  sgd.sgd.lr = 0.5f;
  auto store = LocalParameterStore::Create(sgd);
  ASSERT_TRUE(store.ok());
  std::vector<float> grad(6, 0.f), params(6, -1.f);
  EXPECT_EQ((*store)->BindBuffers(grad, absl::MakeSpan(params)).code(),
            absl::StatusCode::kFailedPrecondition);  // not registered
  ASSERT_TRUE((*store)->Register(Signature(), {1, 2, 3, 4, 5, 6}).ok());
  EXPECT_EQ((*store)->BindBuffers(grad, absl::MakeSpan(params.data(), 5)).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE((*store)->BindBuffers(grad, absl::MakeSpan(params)).ok());
  EXPECT_EQ(params, (std::vector<float>{1, 2, 3, 4, 5, 6}));  // the current version, once
  ASSERT_TRUE(PullSync(**store, 0, 0, 2, absl::MakeSpan(params)).ok());

  grad = {2, 2, 2, 2, 4, 4};
  ASSERT_TRUE(PushSync(**store, 0, 2, 0, 2, grad).ok());
  EXPECT_EQ((*store)->version(), 1);
  EXPECT_EQ(params, (std::vector<float>{1, 2, 3, 4, 5, 6}));  // not before the pull
  ASSERT_TRUE(PullSync(**store, 1, 1, 2, absl::MakeSpan(params)).ok());
  EXPECT_EQ(params, (std::vector<float>{1, 2, 3, 4, 4, 5}));
  ASSERT_TRUE(PullSync(**store, 1, 0, 1, absl::MakeSpan(params)).ok());
  EXPECT_EQ(params, (std::vector<float>{0.5f, 1.5f, 2.5f, 3.5f, 4, 5}));
  // Pulling again applies nothing again.
  ASSERT_TRUE(PullSync(**store, 1, 0, 2, absl::MakeSpan(params)).ok());
  EXPECT_EQ(params, (std::vector<float>{0.5f, 1.5f, 2.5f, 3.5f, 4, 5}));
  EXPECT_EQ((*store)->bytes_copied(), 0);

  // A push from another buffer, and one that would lose an update (its
  // gradient rewritten before the last update was pulled), are refused.
  std::vector<float> other(6, 1.f);
  EXPECT_EQ(PushSync(**store, 1, 2, 0, 2, other).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(PushSync(**store, 1, 2, 1, 2, grad).ok());
  ASSERT_TRUE(PushSync(**store, 1, 2, 0, 1, grad).ok());
  ASSERT_TRUE(PullSync(**store, 2, 0, 1, absl::MakeSpan(params)).ok());
  EXPECT_EQ(PushSync(**store, 2, 2, 1, 2, grad).code(), absl::StatusCode::kFailedPrecondition);
  // Another buffer may still read the parameters (a copy), the pending
  // update of segment 1 applied from the bound gradients (lr 0.5, 2
  // samples: g / 4), and the binding stands: the bound buffer pushes on.
  std::vector<float> copy(6, 0.f);
  auto pulled = (*store)->Pull(2, absl::MakeSpan(copy));
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_EQ(copy, (std::vector<float>{0, 1, 2, 3, 3, 4}));
  EXPECT_EQ(copy, params);
  EXPECT_EQ((*store)->bytes_copied(), 6 * 4);
  EXPECT_TRUE(PushSync(**store, 2, 2, 1, 2, grad).ok());
}

// The store's arithmetic is the server's: the same SGD (momentum, weight
// decay, an epoch schedule) of the same sum, bit for bit, bound or not,
// over gradients with zeros of both signs, pushed per segment back to
// front and whole, and an iteration without samples.
TEST(LocalParameterStoreTest, UpdatesAreTheServersBitForBit) {
  OptimizerOptions sgd;
  sgd.sgd.lr = 0.1f;
  sgd.sgd.momentum = 0.9f;
  sgd.sgd.weight_decay = 5e-4f;
  sgd.schedule.unit = LrSchedule::Unit::kEpochs;
  sgd.schedule.step_size = 1;
  sgd.schedule.gamma = 0.5f;
  sgd.schedule.steps_per_epoch = 3;
  const std::vector<ParamSpec> signature = {
      {"a", {3, 5}, DType::kF32}, {"b", {5}, DType::kF32}, {"c", {7}, DType::kF32}};
  const int64_t n = 27;
  std::mt19937 rng(11);
  auto uniform = [&rng] { return static_cast<double>(rng() >> 8) * 0x1.0p-24; };
  std::vector<float> initial(n);
  for (float& v : initial) v = static_cast<float>(uniform() - 0.5);

  CpuDevice device(0, 1);
  server::ParameterServerOptions server_options;
  server_options.optimizer = sgd;
  auto server = server::ParameterServer::Create(server_options, signature, initial, &device);
  ASSERT_TRUE(server.ok()) << server.status();
  auto reg = (*server)->Register("w", signature, -1, sgd.schedule.steps_per_epoch);
  ASSERT_TRUE(reg.ok()) << reg.status();
  auto unbound = LocalParameterStore::Create(sgd);
  auto bound = LocalParameterStore::Create(sgd);
  ASSERT_TRUE(unbound.ok() && bound.ok());
  ASSERT_TRUE((*unbound)->Register(signature, initial).ok());
  ASSERT_TRUE((*bound)->Register(signature, initial).ok());
  std::vector<float> grad(n), params(n), unbound_params(n), server_params(n);
  ASSERT_TRUE((*bound)->BindBuffers(grad, absl::MakeSpan(params)).ok());

  for (int64_t it = 0; it < 8; ++it) {
    for (float& g : grad) {
      const double u = uniform();
      g = u < 0.1 ? 0.f : u < 0.2 ? -0.f : static_cast<float>(u - 0.6);
    }
    const int64_t samples = it == 4 ? 0 : 4 + it;
    const int64_t ends[] = {15, 20, 27};
    for (int key = 0; key < 3; ++key) {
      const int64_t begin = key == 0 ? 0 : ends[key - 1];
      ASSERT_TRUE(server::Push(**server, reg->rank, it, key, 0, samples,
                               absl::MakeConstSpan(grad).subspan(begin, ends[key] - begin))
                      .ok());
    }
    if (it % 2 == 0) {
      for (int s = 2; s >= 0; --s) ASSERT_TRUE(PushSync(**bound, it, samples, s, s + 1, grad).ok());
      ASSERT_TRUE((*unbound)->Push(it, samples, grad).ok());
    } else {
      ASSERT_TRUE(PushSync(**bound, it, samples, 0, 3, grad).ok());
      for (int s = 2; s >= 0; --s) {
        ASSERT_TRUE(PushSync(**unbound, it, samples, s, s + 1, grad).ok());
      }
    }
    ASSERT_TRUE(PullSync(**bound, it + 1, 0, 3, absl::MakeSpan(params)).ok());
    ASSERT_TRUE(PullSync(**unbound, it + 1, 0, 3, absl::MakeSpan(unbound_params)).ok());
    ASSERT_TRUE(Pull(**server, it + 1, absl::Now(), absl::MakeSpan(server_params)).ok());
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(std::signbit(params[i]), std::signbit(server_params[i])) << it << " " << i;
      ASSERT_EQ(params[i], server_params[i]) << "iteration " << it << " element " << i;
      ASSERT_EQ(std::signbit(unbound_params[i]), std::signbit(server_params[i]));
      ASSERT_EQ(unbound_params[i], server_params[i]) << "iteration " << it << " element " << i;
    }
  }
}

// Loss scaling as the server does it, bit for bit: scaled gradients divided
// again, an overflowing iteration skipped (parameters and momentum kept),
// the scale halved, then doubled after the growth interval.
TEST(LocalParameterStoreTest, LossScalingIsTheServersBitForBit) {
  OptimizerOptions sgd;
  sgd.sgd.lr = 0.1f;
  sgd.sgd.momentum = 0.9f;
  LossScaleOptions scaling;
  scaling.dynamic = true;
  scaling.initial = 256.f;
  scaling.growth_interval = 2;
  const std::vector<ParamSpec> signature = Signature();
  const std::vector<float> initial = {1, 2, 3, 4, 5, 6};
  CpuDevice device(0, 1);
  server::ParameterServerOptions server_options;
  server_options.optimizer = sgd;
  server_options.loss_scale = scaling;
  auto server = server::ParameterServer::Create(server_options, signature, initial, &device);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE((*server)->Register("w", signature, -1, 0).ok());
  auto store = LocalParameterStore::Create(sgd, 1, scaling);
  ASSERT_TRUE(store.ok()) << store.status();
  auto reg = (*store)->Register(signature, initial);
  ASSERT_TRUE(reg.ok());
  EXPECT_EQ(reg->loss_scale, 256.f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> params(6), server_params(6);
  for (int64_t it = 0; it < 6; ++it) {
    const float scale = (*store)->LossScale();
    ASSERT_EQ(scale, (*server)->loss_scale().scale) << "iteration " << it;
    std::vector<float> grad = {0.5f, -1.f, 0.25f, 2.f, 1.f, -0.5f};
    for (float& g : grad) g *= scale;
    if (it == 2) grad.assign(6, nan);  // an overflow: the trainer's poisoned gradient
    ASSERT_TRUE((*store)->Push(it, 3, grad).ok()) << "iteration " << it;
    ASSERT_TRUE(Push(**server, 0, it, 0, 0, 3, absl::MakeConstSpan(grad).subspan(0, 4)).ok());
    ASSERT_TRUE(Push(**server, 0, it, 1, 0, 3, absl::MakeConstSpan(grad).subspan(4, 2)).ok());
    ASSERT_TRUE((*store)->Pull(it + 1, absl::MakeSpan(params)).ok());
    ASSERT_TRUE(Pull(**server, it + 1, absl::Now(), absl::MakeSpan(server_params)).ok());
    EXPECT_EQ(params, server_params) << "iteration " << it;
    for (float x : params) EXPECT_TRUE(std::isfinite(x));
  }
  // 256, 256 -> 512 after two clean, halved to 256 by the overflow, then
  // 256, 512 after two more clean, 512 at the end.
  EXPECT_EQ((*store)->LossScale(), (*server)->loss_scale().scale);
  EXPECT_EQ((*store)->LossScale(), 512.f);
  EXPECT_EQ((*store)->skipped_iterations(), 1);
  // Without loss scaling a non-finite push is refused, as before.
  auto plain = LocalParameterStore::Create(sgd);
  ASSERT_TRUE((*plain)->Register(signature, initial).ok());
  EXPECT_EQ((*plain)->Push(0, 3, std::vector<float>(6, nan)).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ps::worker
