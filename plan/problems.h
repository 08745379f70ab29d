// The problem list PlanJob collects, one line per problem, each starting
// with its proto field path ("<field path>: <reason>"), and the helpers that
// word problems alike everywhere: quoted lists, "must be one of", numbers.
#ifndef TRAINYARD_PLAN_PROBLEMS_H_
#define TRAINYARD_PLAN_PROBLEMS_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace trainyard {

// At most this many problems are listed; the rest are counted.
inline constexpr size_t kMaxListedProblems = 50;

class Problems {
 public:
  void Add(const std::string& path, const std::string& reason);
  bool empty() const { return count_ == 0; }
  size_t size() const { return count_; }
  // The listed problems, one per line, and "... and N more" when some were
  // only counted.
  std::string Text() const;
  // InvalidArgument: "<heading> (N problems):" and then Text().
  absl::Status ToStatus(const std::string& heading) const;

 private:
  std::vector<std::string> lines_;
  size_t count_ = 0;
};

// "a", "b", "c" as Quote writes each.
std::string QuotedList(const std::vector<std::string>& names);

// Checks `value` is one of `allowed`; on failure adds
// `path: must be one of "a", "b", got "x"` and returns false.
bool CheckOneOf(Problems* p, const std::string& path, const std::string& value,
                const std::vector<std::string>& allowed);

// A double as problems show it ("%g").
std::string FormatDouble(double v);

}  // namespace trainyard

#endif  // TRAINYARD_PLAN_PROBLEMS_H_
