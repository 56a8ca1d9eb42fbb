#include "server/consistency/consistency.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace ps::server {

absl::Status Consistency::CheckNotAhead(int64_t /*iteration*/, int64_t /*version*/) const {
  return absl::OkStatus();
}

std::optional<int64_t> Consistency::ReplyStaleness(int64_t /*iteration*/,
                                                   int64_t /*based_on_version*/) const {
  return std::nullopt;
}

absl::StatusOr<std::shared_ptr<const Consistency>> ParseConsistency(absl::string_view text) {
  if (text == "sync") return SyncConsistency();
  if (text == "async") return AsyncConsistency();
  int64_t bound = -1;
  absl::string_view digits = text;
  if (absl::ConsumePrefix(&digits, "ssp:") && !digits.empty() && digits.size() <= 18 &&
      std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
      absl::SimpleAtoi(digits, &bound) && bound <= kMaxStaleness) {
    return SspConsistency(bound);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "consistency '", text, "': use sync, async or ssp:S (S a whole number of steps, 0 to ",
      kMaxStaleness, ")"));
}

}  // namespace ps::server
