#ifndef PS_COMMON_INT_LIST_H_
#define PS_COMMON_INT_LIST_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ps {

// Parses "a,b,c" into positive integers (empty items skipped), as the
// daemons' shape and width flags need. kInvalidArgument names `what` (e.g.
// "--mlp_hidden") and the bad item.
absl::StatusOr<std::vector<int64_t>> ParsePositiveIntList(absl::string_view what,
                                                          absl::string_view text);

}  // namespace ps

#endif  // PS_COMMON_INT_LIST_H_
