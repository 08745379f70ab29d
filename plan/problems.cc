#include "plan/problems.h"

#include <algorithm>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "plan/job_plan.h"

namespace trainyard {

void Problems::Add(const std::string& path, const std::string& reason) {
  ++count_;
  if (lines_.size() < kMaxListedProblems) {
    lines_.push_back(absl::StrCat(path, ": ", reason));
  }
}

std::string Problems::Text() const {
  std::string out = absl::StrJoin(lines_, "\n");
  if (count_ > lines_.size()) {
    absl::StrAppend(&out, "\n... and ", count_ - lines_.size(), " more");
  }
  return out;
}

absl::Status Problems::ToStatus(const std::string& heading) const {
  return absl::InvalidArgumentError(
      absl::StrCat(heading, " (", count_,
                   count_ == 1 ? " problem" : " problems", "):\n", Text()));
}

std::string Quote(const std::string& s) {
  if (s.size() <= kMaxQuotedBytes) return absl::StrCat("\"", s, "\"");
  return absl::StrCat("\"", absl::CHexEscape(s.substr(0, kMaxQuotedBytes)),
                      "...\" (", s.size(), " bytes)");
}

std::string QuotedList(const std::vector<std::string>& names) {
  std::vector<std::string> quoted;
  for (const auto& n : names) quoted.push_back(Quote(n));
  return absl::StrJoin(quoted, ", ");
}

bool CheckOneOf(Problems* p, const std::string& path, const std::string& value,
                const std::vector<std::string>& allowed) {
  if (std::find(allowed.begin(), allowed.end(), value) != allowed.end()) {
    return true;
  }
  p->Add(path, absl::StrCat("must be one of ", QuotedList(allowed), ", got ",
                            Quote(value)));
  return false;
}

std::string FormatDouble(double v) { return absl::StrFormat("%g", v); }

}  // namespace trainyard
