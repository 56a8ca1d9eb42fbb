#ifndef PS_SERVER_PARAMETER_SERVER_OPTIONS_H_
#define PS_SERVER_PARAMETER_SERVER_OPTIONS_H_

// What a ParameterServer is made with (server/parameter_server.h), and the
// checks Create makes of it.

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "common/clock.h"
#include "common/optimizer/loss_scale.h"
#include "common/optimizer/optimizer.h"
#include "common/timed_event.h"
#include "server/consistency/consistency.h"

namespace ps::server {

// The most workers a server takes; with kMaxSamplesPerPush
// (common/push_checks.h) the sum of the samples stays inside int64.
inline constexpr int kMaxWorkers = 1 << 22;

struct ParameterServerOptions {
  // Workers that take part in every synchronous iteration.
  int num_workers = 1;
  // How pushes become updates: sync (the default: the iterations below,
  // equivalent to one device's SGD on the global batch), async or ssp:S
  // (server/consistency/: each policy's file says what it promises).
  // Never null (kInvalidArgument).
  std::shared_ptr<const Consistency> consistency = SyncConsistency();
  // What each update writes (common/optimizer/optimizer.h): kind "sgd",
  // the parameters after SGD's step; kind "none" (a sum-only server), the
  // iteration's mean gradient, version 0 staying the initial parameters,
  // for workers that apply an optimizer of their own. "none" needs every
  // version to be one whole iteration's mean: it refuses a consistency
  // that applies each push alone (async) and dynamic loss scaling.
  OptimizerOptions optimizer;
  // Dynamic loss scaling (common/optimizer/loss_scale.h), under a policy
  // that supports it (sync; Create refuses it otherwise). Workers multiply
  // their loss by loss_scale() and push the scaled gradients. A chunk
  // pushed with a non-finite value is an overflow then, not an error: that
  // chunk's update in the iteration is skipped (its parameters and
  // momentum stay, its version advances), and a worker that overflowed
  // anywhere pushes every chunk non-finite (the trainer does), so the whole
  // iteration is skipped on every shard.
  LossScaleOptions loss_scale;
  // Gradients and parameters move in chunks of at most this many elements
  // per key, which bounds every message: the default keeps a chunk's whole
  // message inside gRPC's default 4 MiB limit.
  int64_t chunk_elements = kDefaultChunkElements;
  static constexpr int64_t kDefaultChunkElements = ((int64_t{4} << 20) - 4096) / 4;
  // Receives the server's timed events (common/timed_event.h), timed from
  // when the call holds the bookkeeping lock and reported once its part
  // succeeded: kServerPush on ServerPushLane(rank) per push message (step:
  // its iteration, bytes: its payload), once summed; kServerUpdate on
  // kServerUpdateLane per chunk applied (the optimizer step and publishing
  // it), reported under the bookkeeping lock as the chunk is published, so
  // once a version is visible its update events are in; kServerPull on
  // kServerPullLane per pull, after the wait (step: the version returned).
  // The name is the first chunk's tensor. OnEvent is called from pushing
  // and pulling threads concurrently and must not call back into the
  // server. Null: no events. Both outlive the server; clock is not null
  // when observer is set (kInvalidArgument).
  EventObserver* observer = nullptr;
  const Clock* clock = Clock::Real();
};

// kInvalidArgument naming the option: num_workers outside 1 ..
// kMaxWorkers, chunk_elements < 1, an observer without a clock, no
// consistency policy, invalid optimizer or loss-scale options, dynamic
// loss scaling under a policy that does not support it, or the optimizer
// "none" under async consistency or with dynamic loss scaling.
absl::Status ValidateParameterServerOptions(const ParameterServerOptions& options);

// The optimizer "none" (a sum-only server) needs every version to be one
// whole iteration's mean gradient: kInvalidArgument, naming the option and
// its flag, under a policy that applies each push alone (async) or with
// dynamic loss scaling.
absl::Status CheckSumOnlyMode(const Consistency& consistency, bool dynamic_loss_scale);

}  // namespace ps::server

#endif  // PS_SERVER_PARAMETER_SERVER_OPTIONS_H_
