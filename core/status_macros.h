// Early-return helpers for absl::Status / absl::StatusOr (Debian's Abseil
// 20220623 has no status_macros.h).
#ifndef TRAINYARD_CORE_STATUS_MACROS_H_
#define TRAINYARD_CORE_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace trainyard {

// `status` with `prefix` put before its message (same code): the caller
// says where an error from below happened.
inline absl::Status Prefixed(const absl::Status& status,
                             absl::string_view prefix) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(prefix, status.message()));
}

}  // namespace trainyard

#define TY_CONCAT_INNER_(a, b) a##b
#define TY_CONCAT_(a, b) TY_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` is not OK.
#define RETURN_IF_ERROR(expr)                \
  do {                                       \
    ::absl::Status _ty_status = (expr);      \
    if (!_ty_status.ok()) return _ty_status; \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, MakeX());` evaluates a StatusOr and either binds
// its value or returns its error.
#define ASSIGN_OR_RETURN(lhs, expr) \
  TY_ASSIGN_OR_RETURN_IMPL_(TY_CONCAT_(_ty_statusor_, __LINE__), lhs, expr)

#define TY_ASSIGN_OR_RETURN_IMPL_(var, lhs, expr) \
  auto var = (expr);                              \
  if (!var.ok()) return std::move(var).status();  \
  lhs = std::move(var).value()

#endif  // TRAINYARD_CORE_STATUS_MACROS_H_
