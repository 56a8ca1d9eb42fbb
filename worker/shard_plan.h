#ifndef PS_WORKER_SHARD_PLAN_H_
#define PS_WORKER_SHARD_PLAN_H_

// How a model's parameters are spread over S parameter-server shards, worked
// out on the workers so each shard stays an ordinary server that knows no
// model (ps-lite's range partition).
//
// The flat parameter buffer (signature order) is cut into S contiguous
// element ranges of nearly equal size; shard s holds range s. A tensor inside
// one range goes whole to its shard under its own name; a tensor a cut falls
// in is split into contiguous element ranges, one piece per shard it spans,
// each a 1-D tensor named "name[begin:end]" (elements of the original tensor,
// end exclusive). Because each shard's part is one contiguous span of the
// flat buffer, in the flat buffer's order, a shard's own flat buffer *is* that
// span: pushes and pulls lend and fill slices of the worker's buffer with no
// gather or scatter copy.
//
// Cuts: the ideal cut s is floor(s * N / S) (N elements in all). A cut that
// falls within `slack` elements of either end of the tensor it lies in moves
// to that end (the nearer one when both qualify; the start on a tie), so no
// tensor is split into a sliver and a small tensor is never split. Each cut
// moves at most `slack` elements, so every shard's load is within
// 2 * slack + 1 elements of N / S (the bound shard_plan_test checks). The
// default slack is floor(N / (32 S)): every load within N / (16 S) + 1
// elements (6.25 % of the ideal, plus one) of N / S; with N >= S no shard is
// empty and every split piece has more than `slack` elements. Slack 0 cuts
// exactly at the ideal points.
//
// The plan depends only on the signature, S and the slack: every worker
// computes the same one, and a rerun (or a restarted worker) gets the same
// names. Empty tensors (a zero dimension) go whole to the shard whose range
// contains their offset (the last non-empty shard when at the very end; shard
// 0 when the model has no elements). Shards with no pieces (more shards than
// elements) are left out of the job.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/param_spec.h"

namespace ps::worker {

// One piece of one tensor as a shard knows it.
struct ShardPiece {
  int key = 0;         // the tensor's index in the model's signature
  int64_t begin = 0;   // the element range of that tensor: [begin, end)
  int64_t end = 0;
  // A range piece of a tensor cut between shards ("name[begin:end]", 1-D);
  // false: the whole tensor, under its own name and shape.
  bool split = false;
  ParamSpec spec;      // name, shape and dtype on the shard
};

// What one shard holds: the flat buffer's elements [flat_begin, flat_end),
// as `pieces` in flat order (pieces[0] starts at flat_begin, each next one
// where the last ended).
struct ShardPart {
  int64_t flat_begin = 0;
  int64_t flat_end = 0;
  std::vector<ShardPiece> pieces;

  int64_t elements() const { return flat_end - flat_begin; }
  bool empty() const { return pieces.empty(); }
  // The shard's signature: the pieces' specs in order.
  std::vector<ParamSpec> signature() const;
};

struct ShardPlanOptions {
  // How far (elements) a cut may move to a tensor's end rather than split
  // it; -1: floor(N / (32 S)).
  int64_t slack_elements = -1;
};

struct ShardPlan {
  int64_t num_parameters = 0;  // N
  int64_t slack_elements = 0;  // the slack used
  std::vector<ShardPart> shards;  // S of them, in shard order
};

// The plan for `signature` over `num_shards` shards. kInvalidArgument for
// num_shards < 1, a slack below -1, or a negative dimension.
absl::StatusOr<ShardPlan> PlanShards(const std::vector<ParamSpec>& signature, int num_shards,
                                     const ShardPlanOptions& options = {});

}  // namespace ps::worker

#endif  // PS_WORKER_SHARD_PLAN_H_
