#include "common/int_list.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ps {

absl::StatusOr<std::vector<int64_t>> ParsePositiveIntList(absl::string_view what,
                                                          absl::string_view text) {
  std::vector<int64_t> out;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int64_t v;
    if (!absl::SimpleAtoi(item, &v) || v < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": '", item, "' is not a positive integer"));
    }
    out.push_back(v);
  }
  return out;
}

}  // namespace ps
