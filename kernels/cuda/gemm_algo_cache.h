// GemmAlgoCache: GemmLt's tuned algorithm choices (an index into cuBLASLt's
// ranked heuristic candidates) by GPU model and problem, for the process,
// loaded from and appended to a file: TRAINYARD_GEMM_CACHE, or
// $HOME/.cache/trainyard/gemm_algos.tsv (none without HOME). One
// "<key>\t<index>" line per choice. File errors only cost a re-tune: a
// damaged or unreadable line is skipped, a failed write is ignored.
//
// No CUDA here; thread-safe.
#ifndef TRAINYARD_KERNELS_CUDA_GEMM_ALGO_CACHE_H_
#define TRAINYARD_KERNELS_CUDA_GEMM_ALGO_CACHE_H_

#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"

namespace trainyard {
namespace gpu {

class GemmAlgoCache {
 public:
  // Indices in the file outside [0, candidates) are skipped.
  explicit GemmAlgoCache(int candidates) : candidates_(candidates) {}

  // The choice for `key` into *index; false when there is none. Reads the
  // file on first use.
  bool Lookup(const std::string& key, int* index);

  // Records the choice for `key` (a key already known keeps its choice)
  // and appends it to the file, creating its folder.
  void Store(const std::string& key, int index);

 private:
  static std::string Path();
  void Load();  // once, under mu_

  const int candidates_;
  std::mutex mu_;
  bool loaded_ = false;
  absl::flat_hash_map<std::string, int> choices_;
};

}  // namespace gpu
}  // namespace trainyard

#endif  // TRAINYARD_KERNELS_CUDA_GEMM_ALGO_CACHE_H_
