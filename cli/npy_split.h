// Large .npy (features, targets) pairs split into .npy shard pairs
// (cli/shard_writer.h): `trainyard data convert`'s .npy input. The inputs
// are streamed in chunks of about 1 MiB, never read whole.
//
// Thread safety: the function shares no state.
#ifndef TRAINYARD_CLI_NPY_SPLIT_H_
#define TRAINYARD_CLI_NPY_SPLIT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cli/shard_writer.h"
#include "core/tensor.h"

namespace trainyard {

// Writes the rows of features[0], then features[1] ... (each float32
// [n_i, D]) with the same rows of targets[i] (int64 [n_i] or float32
// [n_i, K]; one dtype and K for all) into `out_dir` as shards of
// `shard_rows` rows, the features stored as `features_dtype` (kFloat32,
// kFloat16 or kBFloat16; cli/shard_writer.h). Returns the pairs written.
// Errors: InvalidArgument naming the file for a file that is not such an
// array (core/npy.h's header errors), a pair whose row counts differ, or a
// width or dtype that differs from the first pair's; InvalidArgument when
// the lists' lengths differ; the writer's errors (a non-empty out_dir is
// FailedPrecondition).
absl::StatusOr<std::vector<ShardPair>> SplitNpyPairs(
    const std::vector<std::string>& features,
    const std::vector<std::string>& targets, const std::string& out_dir,
    int64_t shard_rows, DType features_dtype,
    ShardWriter::ProgressFn progress = nullptr);

}  // namespace trainyard

#endif  // TRAINYARD_CLI_NPY_SPLIT_H_
