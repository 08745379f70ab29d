#include "kernels/cuda/gemm_algo_cache.h"

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace trainyard {
namespace gpu {

bool GemmAlgoCache::Lookup(const std::string& key, int* index) {
  std::lock_guard<std::mutex> lock(mu_);
  Load();
  auto it = choices_.find(key);
  if (it == choices_.end()) return false;
  *index = it->second;
  return true;
}

void GemmAlgoCache::Store(const std::string& key, int index) {
  std::lock_guard<std::mutex> lock(mu_);
  Load();
  if (!choices_.emplace(key, index).second) return;
  const std::string path = Path();
  if (path.empty()) return;
  const size_t slash = path.rfind('/');
  if (slash != std::string::npos) {
    // mkdir -p of the folder, quietly.
    std::string dir;
    for (absl::string_view part :
         absl::StrSplit(path.substr(0, slash), '/', absl::SkipEmpty())) {
      dir = absl::StrCat(dir, "/", part);
      mkdir(dir.c_str(), 0755);
    }
  }
  std::ofstream out(path, std::ios::app);
  out << key << "\t" << index << "\n";
}

std::string GemmAlgoCache::Path() {
  if (const char* p = std::getenv("TRAINYARD_GEMM_CACHE")) return p;
  const char* home = std::getenv("HOME");
  if (home == nullptr || home[0] == '\0') return "";
  return absl::StrCat(home, "/.cache/trainyard/gemm_algos.tsv");
}

void GemmAlgoCache::Load() {
  if (loaded_) return;
  loaded_ = true;
  const std::string path = Path();
  if (path.empty()) return;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const size_t tab = line.rfind('\t');
    int index = 0;
    if (tab == std::string::npos ||
        !absl::SimpleAtoi(line.substr(tab + 1), &index) || index < 0 ||
        index >= candidates_) {
      continue;  // a damaged line: that problem is tuned again
    }
    choices_.emplace(line.substr(0, tab), index);
  }
}

}  // namespace gpu
}  // namespace trainyard
