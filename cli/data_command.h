// `trainyard data convert` and `trainyard data inspect`: a job's data as
// .npy shard pairs (docs/DATA.md). convert turns CSV files
// (cli/csv_shards.h) or large .npy pairs (cli/npy_split.h) into a new shard
// folder, streaming, with progress on stderr at most once a second; inspect
// prints each pair of a folder or glob (cli/shard_inspect.h) and the totals.
// Needs no controller.
#ifndef TRAINYARD_CLI_DATA_COMMAND_H_
#define TRAINYARD_CLI_DATA_COMMAND_H_

#include <cstdint>
#include <string>
#include <vector>

namespace trainyard {

// The `data` command's flags (cli/trainyard_main.cc defines them).
struct DataFlags {
  std::string in;              // convert: CSV files or .npy features files,
                               // comma-separated; inspect: a folder or glob
  std::string targets_in;      // convert: .npy targets files, one per --in file
  std::string out;             // convert: the new shard folder
  int64_t shard_rows = 0;      // convert: rows per shard pair
  std::string target_columns;  // convert, CSV: comma-separated names
  std::string feature_columns;  // convert, CSV: comma-separated names
  std::string target_kind;      // convert, CSV: "", "class" or "float"
  // convert: how features are stored, "" (float32), "float32", "float16"
  // or "bfloat16"; inspect: what the features files must hold ("": float32
  // or float16, as each header says).
  std::string features_dtype;
};

// `args` is the command line after flag parsing: args[1] is "data",
// args[2] "convert" or "inspect". Exit status: 0 done, 1 the conversion or
// a shard failed (the error names the file and, for CSV, line and column),
// 2 bad usage.
int DataCommand(const DataFlags& flags, const std::vector<char*>& args);

}  // namespace trainyard

#endif  // TRAINYARD_CLI_DATA_COMMAND_H_
