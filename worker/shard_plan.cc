#include "worker/shard_plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ps::worker {

std::vector<ParamSpec> ShardPart::signature() const {
  std::vector<ParamSpec> out;
  out.reserve(pieces.size());
  for (const ShardPiece& piece : pieces) out.push_back(piece.spec);
  return out;
}

absl::StatusOr<ShardPlan> PlanShards(const std::vector<ParamSpec>& signature, int num_shards,
                                     const ShardPlanOptions& options) {
  if (num_shards < 1) {
    return absl::InvalidArgumentError(absl::StrCat("a plan needs at least one shard, got ",
                                                   num_shards));
  }
  if (options.slack_elements < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("slack of ", options.slack_elements, " elements"));
  }
  // Step 0: every tensor's offset in the flat buffer.
  std::vector<int64_t> offsets, sizes;
  int64_t total = 0;
  for (const ParamSpec& spec : signature) {
    for (int64_t d : spec.shape) {
      if (d < 0) {
        return absl::InvalidArgumentError(absl::StrCat("parameter '", spec.name, "' has shape ",
                                                       ShapeToString(spec.shape)));
      }
    }
    offsets.push_back(total);
    sizes.push_back(NumElements(spec.shape));
    total += sizes.back();
  }
  const int64_t s_count = num_shards;
  ShardPlan plan;
  plan.num_parameters = total;
  plan.slack_elements =
      options.slack_elements >= 0 ? options.slack_elements : total / (32 * s_count);
  const int64_t slack = plan.slack_elements;

  // Step 1: the ideal cuts, each moved to the end of the tensor it falls in
  // when that end is within the slack. The move is monotone in the cut, so
  // the cuts stay in order.
  std::vector<int64_t> cuts(s_count + 1);
  for (int64_t s = 0; s <= s_count; ++s) {
    // s * N / S without overflow for any N a host can hold.
    const int64_t cut = static_cast<int64_t>(static_cast<__int128>(s) * total / s_count);
    // The tensor with offset < cut < its end, if any.
    const auto it = std::upper_bound(offsets.begin(), offsets.end(), cut);
    int64_t moved = cut;
    if (it != offsets.begin()) {
      const size_t k = static_cast<size_t>(it - offsets.begin()) - 1;
      const int64_t a = offsets[k], b = offsets[k] + sizes[k];
      if (a < cut && cut < b) {
        if (cut - a <= slack && cut - a <= b - cut) {
          moved = a;
        } else if (b - cut <= slack) {
          moved = b;
        }
      }
    }
    cuts[s] = moved;
  }

  // Step 2: each shard's range, and the pieces of the tensors it overlaps.
  plan.shards.resize(s_count);
  for (int64_t s = 0; s < s_count; ++s) {
    plan.shards[s].flat_begin = cuts[s];
    plan.shards[s].flat_end = cuts[s + 1];
  }
  // An empty tensor at offset a: the last non-empty shard starting at or
  // before a (the one containing a, or the last one when a == N); shard 0
  // when every shard is empty.
  auto owner_of_empty = [&](int64_t a) {
    int64_t owner = 0;
    for (int64_t s = 0; s < s_count; ++s) {
      if (cuts[s] < cuts[s + 1] && cuts[s] <= a) owner = s;
    }
    return owner;
  };
  for (size_t k = 0; k < signature.size(); ++k) {
    const int64_t a = offsets[k], b = offsets[k] + sizes[k];
    if (a == b) {
      ShardPiece piece;
      piece.key = static_cast<int>(k);
      piece.spec = signature[k];
      plan.shards[owner_of_empty(a)].pieces.push_back(std::move(piece));
      continue;
    }
    for (int64_t s = 0; s < s_count; ++s) {
      const int64_t lo = std::max(a, cuts[s]), hi = std::min(b, cuts[s + 1]);
      if (lo >= hi) continue;
      ShardPiece piece;
      piece.key = static_cast<int>(k);
      piece.begin = lo - a;
      piece.end = hi - a;
      piece.split = hi - lo != sizes[k];
      piece.spec = signature[k];
      if (piece.split) {
        piece.spec.name = absl::StrCat(signature[k].name, "[", piece.begin, ":", piece.end, "]");
        piece.spec.shape = {piece.end - piece.begin};
      }
      plan.shards[s].pieces.push_back(std::move(piece));
    }
  }
  return plan;
}

}  // namespace ps::worker
