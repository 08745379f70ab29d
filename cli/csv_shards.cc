#include "cli/csv_shards.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/status_macros.h"

namespace trainyard {
namespace {

// A cell or column name for a message: escaped and cut to a bounded size.
std::string Quote(absl::string_view text) {
  constexpr size_t kMax = 40;
  return absl::StrCat("\"", absl::CEscape(text.substr(0, kMax)),
                      text.size() > kMax ? "...\"" : "\"");
}

std::vector<absl::string_view> SplitCells(absl::string_view line) {
  std::vector<absl::string_view> cells = absl::StrSplit(line, ',');
  for (absl::string_view& cell : cells) cell = absl::StripAsciiWhitespace(cell);
  return cells;
}

// Which cells of a row go where, from the first file's header.
struct ColumnPlan {
  std::vector<std::string> header;
  std::vector<int> features;  // cell indices, in feature order
  std::vector<int> targets;
  bool classes = false;  // int64 class ids, else float32 targets
};

absl::Status HeaderError(const std::string& file, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(file, ":1: ", why));
}

// The indices of `names` in the header, by name.
absl::StatusOr<std::vector<int>> Lookup(
    const std::string& file, const absl::flat_hash_map<std::string, int>& index,
    const std::vector<std::string>& names, absl::string_view flag) {
  std::vector<int> out;
  for (const std::string& name : names) {
    auto it = index.find(name);
    if (it == index.end()) {
      return HeaderError(file, absl::StrCat("no column ", Quote(name),
                                            " (named by --", flag, ")"));
    }
    out.push_back(it->second);
  }
  return out;
}

absl::StatusOr<ColumnPlan> PlanColumns(const std::string& file,
                                       absl::string_view header_line,
                                       const CsvConvertOptions& options) {
  ColumnPlan plan;
  absl::flat_hash_map<std::string, int> index;
  for (absl::string_view name : SplitCells(header_line)) {
    if (name.empty()) return HeaderError(file, "a column has no name");
    if (!index.emplace(std::string(name), plan.header.size()).second) {
      return HeaderError(
          file, absl::StrCat("column ", Quote(name), " appears twice"));
    }
    plan.header.emplace_back(name);
  }
  if (options.target_columns.empty()) {
    return absl::InvalidArgumentError(
        "--target_columns: name at least one target column");
  }
  ASSIGN_OR_RETURN(plan.targets, Lookup(file, index, options.target_columns,
                                        "target_columns"));
  std::vector<bool> is_target(plan.header.size(), false);
  for (int t : plan.targets) is_target[t] = true;
  if (options.feature_columns.empty()) {
    for (int i = 0; i < static_cast<int>(plan.header.size()); ++i) {
      if (!is_target[i]) plan.features.push_back(i);
    }
  } else {
    ASSIGN_OR_RETURN(plan.features, Lookup(file, index, options.feature_columns,
                                           "feature_columns"));
  }
  std::vector<bool> used(plan.header.size(), false);
  for (int i : plan.features) {
    if (is_target[i] || used[i]) {
      return HeaderError(file, absl::StrCat("column ", Quote(plan.header[i]),
                                            " is used twice"));
    }
    used[i] = true;
  }
  if (plan.features.empty()) return HeaderError(file, "no feature columns");
  plan.classes =
      options.target_kind == TargetKind::kClass ||
      (options.target_kind == TargetKind::kAuto && plan.targets.size() == 1);
  if (plan.classes && plan.targets.size() != 1) {
    return absl::InvalidArgumentError(
        "--target_kind class takes exactly one target column");
  }
  return plan;
}

// Parses the cells of data line `line_no` of `file` into one row: `x` [D]
// and `y` (one int64, or [K] floats).
absl::Status ParseRow(const std::string& file, int64_t line_no,
                      absl::string_view line, const ColumnPlan& plan, float* x,
                      void* y) {
  const std::vector<absl::string_view> cells = SplitCells(line);
  const std::string where = absl::StrCat(file, ":", line_no, ": ");
  if (cells.size() != plan.header.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, cells.size(), " cells, the header has ",
                     plan.header.size(), " columns"));
  }
  auto cell_error = [&](int column, const absl::Status& why) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "column ", Quote(plan.header[column]), ": ",
                     Quote(cells[column]), " ", why.message()));
  };
  for (size_t i = 0; i < plan.features.size(); ++i) {
    absl::StatusOr<float> v = ParseFloatCell(cells[plan.features[i]]);
    if (!v.ok()) return cell_error(plan.features[i], v.status());
    x[i] = *v;
  }
  if (plan.classes) {
    absl::StatusOr<int64_t> id = ParseClassCell(cells[plan.targets[0]]);
    if (!id.ok()) return cell_error(plan.targets[0], id.status());
    *static_cast<int64_t*>(y) = *id;
    return absl::OkStatus();
  }
  for (size_t i = 0; i < plan.targets.size(); ++i) {
    absl::StatusOr<float> v = ParseFloatCell(cells[plan.targets[i]]);
    if (!v.ok()) return cell_error(plan.targets[i], v.status());
    static_cast<float*>(y)[i] = *v;
  }
  return absl::OkStatus();
}

absl::Status OpenCsv(const std::string& file, std::ifstream* in) {
  in->open(file, std::ios::binary);
  if (!in->is_open()) {
    return absl::NotFoundError(
        absl::StrCat(file, ": cannot open: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

// Reads one line without its "\n" or "\r\n"; false at the end.
bool ReadLine(std::ifstream& in, std::string* line) {
  if (!std::getline(in, *line)) return false;
  if (!line->empty() && line->back() == '\r') line->pop_back();
  return true;
}

// Streams the data lines of `file` (whose header was checked against the
// plan) into `writer`.
absl::Status ConvertRows(const std::string& file, std::ifstream& in,
                         const ColumnPlan& plan, ShardWriter& writer) {
  std::vector<float> x(plan.features.size());
  std::vector<float> y_floats(plan.targets.size());
  int64_t y_class = 0;
  void* y = plan.classes ? static_cast<void*>(&y_class) : y_floats.data();
  std::string line;
  for (int64_t line_no = 2; ReadLine(in, &line); ++line_no) {
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    RETURN_IF_ERROR(ParseRow(file, line_no, line, plan, x.data(), y));
    RETURN_IF_ERROR(writer.Append(x.data(), y, 1));
  }
  if (in.bad()) {
    return absl::InternalError(absl::StrCat(file, ": read failed"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<float> ParseFloatCell(absl::string_view cell) {
  cell = absl::StripAsciiWhitespace(cell);
  if (cell.empty()) return absl::InvalidArgumentError("is empty");
  double d = 0;
  if (!absl::SimpleAtod(cell, &d)) {
    return absl::InvalidArgumentError("is not a number");
  }
  if (!std::isfinite(d)) {
    return absl::InvalidArgumentError("is not a finite number");
  }
  const float f = static_cast<float>(d);
  if (!std::isfinite(f)) {
    return absl::InvalidArgumentError("is out of float32 range");
  }
  return f;
}

absl::StatusOr<int64_t> ParseClassCell(absl::string_view cell) {
  cell = absl::StripAsciiWhitespace(cell);
  if (cell.empty()) return absl::InvalidArgumentError("is empty");
  int64_t id = 0;
  if (!absl::SimpleAtoi(cell, &id)) {
    double d = 0;
    if (!absl::SimpleAtod(cell, &d) || !std::isfinite(d)) {
      return absl::InvalidArgumentError("is not a number");
    }
    // Integral floats up to 2^53 are exact; "3.0" is class 3.
    if (d != std::trunc(d) || std::fabs(d) > 9007199254740992.0) {
      return absl::InvalidArgumentError("is not an integral class id");
    }
    id = static_cast<int64_t>(d);
  }
  if (id < 0) return absl::InvalidArgumentError("is a negative class id");
  return id;
}

absl::StatusOr<std::vector<ShardPair>> ConvertCsv(
    const CsvConvertOptions& options, ShardWriter::ProgressFn progress) {
  if (options.inputs.empty()) {
    return absl::InvalidArgumentError("no input files");
  }
  const std::string& first = options.inputs[0];
  std::ifstream in;
  RETURN_IF_ERROR(OpenCsv(first, &in));
  std::string header;
  if (!ReadLine(in, &header)) {
    return absl::InvalidArgumentError(
        absl::StrCat(first, ": empty file (expected a header row)"));
  }
  ASSIGN_OR_RETURN(ColumnPlan plan, PlanColumns(first, header, options));
  ShardLayout layout;
  layout.shard_rows = options.shard_rows;
  layout.features = static_cast<int64_t>(plan.features.size());
  layout.features_dtype = options.features_dtype;
  layout.target_dtype = plan.classes ? DType::kInt64 : DType::kFloat32;
  layout.target_width =
      plan.classes ? 0 : static_cast<int64_t>(plan.targets.size());
  ASSIGN_OR_RETURN(std::unique_ptr<ShardWriter> writer,
                   ShardWriter::Create(options.out_dir, layout, progress));
  for (size_t f = 0; f < options.inputs.size(); ++f) {
    const std::string& file = options.inputs[f];
    if (f > 0) {
      in = std::ifstream();
      RETURN_IF_ERROR(OpenCsv(file, &in));
      if (!ReadLine(in, &header) ||
          SplitCells(header) != std::vector<absl::string_view>(
                                    plan.header.begin(), plan.header.end())) {
        return HeaderError(
            file, absl::StrCat("the header differs from ", first, "'s"));
      }
    }
    RETURN_IF_ERROR(ConvertRows(file, in, plan, *writer));
  }
  if (writer->rows() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("no data rows in ", absl::StrJoin(options.inputs, ", ")));
  }
  return writer->Finish();
}

}  // namespace trainyard
