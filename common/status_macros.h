#ifndef PS_COMMON_STATUS_MACROS_H_
#define PS_COMMON_STATUS_MACROS_H_

// Debian's abseil (20220623) ships no status macros; these are ours.
//
//   PS_RETURN_IF_ERROR(DoThing());
//   PS_ASSIGN_OR_RETURN(Tensor t, Tensor::Create(...));

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define PS_STATUS_CONCAT_INNER_(a, b) a##b
#define PS_STATUS_CONCAT_(a, b) PS_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status) once and returns it from the enclosing
// function if it is not OK.
#define PS_RETURN_IF_ERROR(expr)                       \
  do {                                                 \
    ::absl::Status ps_status_ = (expr);                \
    if (!ps_status_.ok()) return ps_status_;           \
  } while (false)

#define PS_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                              \
  if (!statusor.ok()) return statusor.status();         \
  lhs = std::move(statusor).value()

// Evaluates `rexpr` (an absl::StatusOr<T>); on error returns its status, else
// moves the value into `lhs`, which may declare a variable.
#define PS_ASSIGN_OR_RETURN(lhs, rexpr) \
  PS_ASSIGN_OR_RETURN_IMPL_(PS_STATUS_CONCAT_(ps_statusor_, __LINE__), lhs, rexpr)

#endif  // PS_COMMON_STATUS_MACROS_H_
