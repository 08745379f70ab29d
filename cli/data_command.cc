#include "cli/data_command.h"

#include <algorithm>
#include <iostream>
#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/csv_shards.h"
#include "cli/npy_split.h"
#include "cli/shard_inspect.h"
#include "cli/shard_writer.h"
#include "core/status_macros.h"

namespace trainyard {
namespace {

constexpr char kConvert[] = "trainyard data convert";
constexpr char kInspect[] = "trainyard data inspect";

std::vector<std::string> SplitList(const std::string& list) {
  return absl::StrSplit(list, ',', absl::SkipWhitespace());
}

int Usage(absl::string_view command, absl::string_view why) {
  std::cerr << command << ": " << why << "\n";
  return 2;
}

int Failed(absl::string_view command, const absl::Status& status) {
  std::cerr << command << ": " << status.message() << "\n";
  return 1;
}

// Rows done and rows/s on stderr, at most once a second.
class Progress {
 public:
  Progress() : start_(absl::Now()), last_(start_) {}

  void Report(int64_t rows) {
    const absl::Time now = absl::Now();
    if (now - last_ < absl::Seconds(1)) return;
    last_ = now;
    std::cerr << absl::StrFormat("%s: %d rows (%.0f rows/s)\n", kConvert, rows,
                                 rows / absl::ToDoubleSeconds(now - start_));
  }

  double Seconds() const { return absl::ToDoubleSeconds(absl::Now() - start_); }

 private:
  const absl::Time start_;
  absl::Time last_;
};

absl::StatusOr<TargetKind> ParseTargetKind(const std::string& kind) {
  if (kind.empty()) return TargetKind::kAuto;
  if (kind == "class") return TargetKind::kClass;
  if (kind == "float") return TargetKind::kFloat;
  return absl::InvalidArgumentError(absl::StrFormat(
      "--target_kind must be class or float, got \"%s\"", kind));
}

// --features_dtype: unset when empty; InvalidArgument for another name.
absl::StatusOr<std::optional<DType>> ParseFeaturesDType(
    const std::string& name) {
  if (name.empty()) return std::nullopt;
  if (name == "float32") return DType::kFloat32;
  if (name == "float16") return DType::kFloat16;
  if (name == "bfloat16") return DType::kBFloat16;
  return absl::InvalidArgumentError(absl::StrFormat(
      "--features_dtype must be float32, float16 or bfloat16, got \"%s\"",
      absl::CEscape(name.substr(0, 32))));
}

// The CSV conversion the flags ask for; InvalidArgument saying what is
// wrong with them.
absl::StatusOr<CsvConvertOptions> CsvOptions(
    const DataFlags& flags, const std::vector<std::string>& inputs) {
  for (const std::string& input : inputs) {
    if (absl::EndsWith(input, ".npy")) {
      return absl::InvalidArgumentError(absl::StrCat(
          input, ": a .npy input needs its targets in --targets_in"));
    }
  }
  CsvConvertOptions options;
  options.inputs = inputs;
  options.out_dir = flags.out;
  options.shard_rows = flags.shard_rows;
  options.target_columns = SplitList(flags.target_columns);
  options.feature_columns = SplitList(flags.feature_columns);
  ASSIGN_OR_RETURN(options.target_kind, ParseTargetKind(flags.target_kind));
  if (options.target_columns.empty()) {
    return absl::InvalidArgumentError("name the targets with --target_columns");
  }
  if (options.target_kind == TargetKind::kClass &&
      options.target_columns.size() != 1) {
    return absl::InvalidArgumentError(
        "--target_kind class takes exactly one target column");
  }
  return options;
}

int Convert(const DataFlags& flags) {
  if (flags.in.empty()) return Usage(kConvert, "give the input with --in");
  if (flags.out.empty()) return Usage(kConvert, "give the folder with --out");
  if (flags.shard_rows < 1) {
    return Usage(kConvert, "give --shard_rows N (N >= 1)");
  }
  const absl::StatusOr<std::optional<DType>> stored =
      ParseFeaturesDType(flags.features_dtype);
  if (!stored.ok()) return Usage(kConvert, stored.status().message());
  const DType features_dtype = stored->value_or(DType::kFloat32);
  const std::vector<std::string> inputs = SplitList(flags.in);
  Progress progress;
  auto report = [&progress](int64_t rows) { progress.Report(rows); };
  absl::StatusOr<std::vector<ShardPair>> pairs;
  if (!flags.targets_in.empty()) {
    if (!flags.target_columns.empty() || !flags.feature_columns.empty()) {
      return Usage(kConvert,
                   "--target_columns and --feature_columns are for CSV input, "
                   "not .npy pairs (--targets_in)");
    }
    pairs = SplitNpyPairs(inputs, SplitList(flags.targets_in), flags.out,
                          flags.shard_rows, features_dtype, report);
  } else {
    absl::StatusOr<CsvConvertOptions> options = CsvOptions(flags, inputs);
    if (!options.ok()) return Usage(kConvert, options.status().message());
    options->features_dtype = features_dtype;
    pairs = ConvertCsv(*options, report);
  }
  if (!pairs.ok()) return Failed(kConvert, pairs.status());
  int64_t rows = 0, overflowed = 0;
  for (const ShardPair& pair : *pairs) {
    rows += pair.rows;
    overflowed += pair.overflowed;
  }
  if (overflowed > 0) {
    std::cerr << absl::StrFormat(
        "%s: warning: %d feature value(s) beyond %s's range were stored as "
        "infinity\n",
        kConvert, overflowed, DTypeName(features_dtype));
  }
  std::cout << absl::StrFormat(
      "wrote %d rows as %d shard pair(s) in %s (%.1f s, %.0f rows/s)\n", rows,
      pairs->size(), flags.out, progress.Seconds(),
      rows / std::max(progress.Seconds(), 1e-9));
  return 0;
}

std::string Describe(const ShardFileInfo& file) {
  return absl::StrFormat("%s %s, %d bytes, sha256 %s", DTypeName(file.dtype),
                         ShapeToString(file.shape), file.bytes, file.sha256);
}

// What every pair must share: the features' width and the targets' kind.
std::string Kind(const ShardPairInfo& pair) {
  const Shape& y = pair.targets.shape;
  return absl::StrFormat(
      "features %s [n, %d], targets %s %s", DTypeName(pair.features.dtype),
      pair.features.shape[1], DTypeName(pair.targets.dtype),
      y.size() == 1 ? "[n]" : absl::StrCat("[n, ", y[1], "]"));
}

int Inspect(const DataFlags& flags) {
  if (flags.in.empty()) {
    return Usage(kInspect, "give the shard folder or a glob with --in");
  }
  const absl::StatusOr<std::optional<DType>> features_dtype =
      ParseFeaturesDType(flags.features_dtype);
  if (!features_dtype.ok()) {
    return Usage(kInspect, features_dtype.status().message());
  }
  auto found = FindShardPairs(flags.in);
  if (!found.ok()) return Failed(kInspect, found.status());
  ShardInspector inspector(*features_dtype);
  int64_t rows = 0, bytes = 0;
  std::string kind;
  for (const auto& [x, y] : *found) {
    absl::StatusOr<ShardPairInfo> pair = inspector.Inspect(x, y);
    if (!pair.ok()) return Failed(kInspect, pair.status());
    std::cout << absl::StrFormat(
        "%s + %s: %d rows\n  features %s\n"
        "  targets  %s\n",
        x, y, pair->rows, Describe(pair->features), Describe(pair->targets));
    if (kind.empty()) kind = Kind(*pair);
    if (Kind(*pair) != kind) {
      return Failed(kInspect, absl::InvalidArgumentError(absl::StrFormat(
                                  "%s: %s, the first pair has %s", x,
                                  Kind(*pair), kind)));
    }
    rows += pair->rows;
    bytes += pair->features.bytes + pair->targets.bytes;
  }
  std::cout << absl::StrFormat(
      "total: %d shard pair(s), %d rows, %d bytes; %s\n", found->size(), rows,
      bytes, kind);
  return 0;
}

}  // namespace

int DataCommand(const DataFlags& flags, const std::vector<char*>& args) {
  const std::string sub = args.size() > 2 ? args[2] : "";
  if (sub == "convert") return Convert(flags);
  if (sub == "inspect") return Inspect(flags);
  std::cerr << "trainyard data: expected \"convert\" or \"inspect\", got \""
            << sub << "\"\n";
  return 2;
}

}  // namespace trainyard
