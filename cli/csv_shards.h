// CSV files to .npy shard pairs (cli/shard_writer.h): `trainyard data
// convert`'s CSV input. Each file has a header row of column names, then
// comma-separated numeric cells, one row per line (blank lines skipped,
// "\r\n" accepted). Files are streamed line by line: memory is one line
// plus the writer's buffers, whatever the file size.
//
// Cells are parsed as numpy's `np.loadtxt(f, delimiter=",",
// skiprows=1).astype(np.float32)` does: the decimal text correctly rounded
// to float64 (absl::SimpleAtod), then rounded to float32, so the shards
// equal numpy's reading bitwise (a direct decimal-to-float32 rounding, like
// strtof, differs from this double rounding for text just past a float32
// rounding midpoint).
//
// Every error names the file, line and column, e.g.
//   a.csv:1234: column "age": "n/a" is not a number
// and a failed conversion leaves no shard behind.
//
// Thread safety: the functions share no state.
#ifndef TRAINYARD_CLI_CSV_SHARDS_H_
#define TRAINYARD_CLI_CSV_SHARDS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cli/shard_writer.h"

namespace trainyard {

enum class TargetKind {
  kAuto,   // kClass for one target column, else kFloat
  kClass,  // one column of integral class ids >= 0: targets int64 [n]
  kFloat,  // targets float32 [n, K]
};

struct CsvConvertOptions {
  std::vector<std::string> inputs;  // CSV files, read in order; every
                                    // file's header must equal the first's
  std::string out_dir;              // new or empty folder
  int64_t shard_rows = 0;           // >= 1
  std::vector<std::string> target_columns;   // >= 1 names
  std::vector<std::string> feature_columns;  // empty: every other column
  TargetKind target_kind = TargetKind::kAuto;
  // How features are stored: kFloat32, kFloat16 or kBFloat16, each cell's
  // float32 rounded to it (cli/shard_writer.h).
  DType features_dtype = DType::kFloat32;
};

// A float cell as numpy reads it (see above), after trimming spaces. The
// reason ("is not a number", ...) when it is empty, not a number, not finite
// or out of float32 range.
absl::StatusOr<float> ParseFloatCell(absl::string_view cell);

// A class-id cell: an integer >= 0, also written as an integral float
// ("3.0", "3e0"). The reason when it is not one.
absl::StatusOr<int64_t> ParseClassCell(absl::string_view cell);

// Converts the CSV files into options.out_dir. Returns the pairs written.
// Errors: InvalidArgument naming the file and line for a bad header (a
// missing, repeated or doubly used column), a ragged line or a bad cell
// (and the column); InvalidArgument for no data rows; the writer's errors
// (a non-empty out_dir is FailedPrecondition). `progress` as ShardWriter's.
absl::StatusOr<std::vector<ShardPair>> ConvertCsv(
    const CsvConvertOptions& options,
    ShardWriter::ProgressFn progress = nullptr);

}  // namespace trainyard

#endif  // TRAINYARD_CLI_CSV_SHARDS_H_
