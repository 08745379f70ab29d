#include "plan/placement.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/block_config.h"
#include "core/tensor.h"
#include "glog/logging.h"
#include "plan/training_check.h"
#include "schedule/schedule.h"

namespace trainyard {
namespace {

using trainyard::v1::OptimizerSpec;
using trainyard::v1::ParallelismSpec;

// Parameter elements of one block (what the split balances).
int64_t BlockParamCount(const MlpBlockConfig& config) {
  int64_t n = 0;
  for (const ParamInfo& info : BlockParamInfos(config)) {
    n += NumElements(info.shape);
  }
  return n;
}

// Blocks per virtual stage: parallelism.split, or the balanced split of the
// blocks' parameter counts (then written to parallelism.split).
std::vector<int> SplitSizes(const std::vector<MlpBlockConfig>& blocks,
                            ParallelismSpec* par) {
  std::vector<int> sizes(par->split().begin(), par->split().end());
  if (sizes.empty()) {
    std::vector<int64_t> counts;
    for (const MlpBlockConfig& c : blocks) counts.push_back(BlockParamCount(c));
    sizes = BalancedSplit(counts, par->stages() * par->chunks());
    for (int n : sizes) par->add_split(n);
  }
  return sizes;
}

// Whether weight decay applies to the parameter `name` under the
// optimizer's decay_mask.
bool Decays(const OptimizerSpec& opt, const ParamInfo& info,
            const std::string& name) {
  if (opt.decay_mask() == "all") return true;
  if (opt.decay_mask() == "patterns") {
    bool decay = true;
    for (const std::string& pat : opt.no_decay()) {
      if (GlobMatch(pat, name)) decay = false;
    }
    return decay;
  }
  return !info.is_bias_or_norm;
}

// Every block's parameters, in block order, each with its stage.
void AddParams(JobPlan* plan) {
  std::vector<int> stage_of_block(plan->blocks.size());
  for (int stage = 0; stage < plan->spec.parallelism().stages(); ++stage) {
    for (int c = 0; c < plan->num_chunks; ++c) {
      const auto [first, end] = plan->ChunkBlocks(stage, c);
      for (int k = first; k < end; ++k) stage_of_block[k] = stage;
    }
  }
  for (int k = 0; k < static_cast<int>(plan->blocks.size()); ++k) {
    for (ParamInfo& info : BlockParamInfos(plan->blocks[k])) {
      JobPlan::ParamSpec ps;
      ps.name = absl::StrCat("blocks.", k, ".", info.name);
      ps.shape = std::move(info.shape);
      ps.block = k;
      ps.stage = stage_of_block[k];
      ps.decay = Decays(plan->spec.optimizer(), info, ps.name);
      plan->params.push_back(std::move(ps));
    }
  }
}

// A problem for each valid no_decay pattern that matches no parameter.
void CheckPatternsMatch(const JobPlan& plan, Problems* p) {
  const OptimizerSpec& opt = plan.spec.optimizer();
  for (int i = 0; i < opt.no_decay_size(); ++i) {
    if (!ValidNoDecayPattern(opt.no_decay(i))) continue;
    const bool any = std::any_of(plan.params.begin(), plan.params.end(),
                                 [&](const JobPlan::ParamSpec& ps) {
                                   return GlobMatch(opt.no_decay(i), ps.name);
                                 });
    if (!any) {
      p->Add(absl::StrCat("optimizer.no_decay[", i, "]"),
             absl::StrCat("pattern ", Quote(opt.no_decay(i)),
                          " matches no parameter"));
    }
  }
}

}  // namespace

void PlaceBlocks(Problems* p, JobPlan* plan) {
  ParallelismSpec* par = plan->spec.mutable_parallelism();
  const std::vector<int> sizes = SplitSizes(plan->blocks, par);
  plan->num_chunks = par->chunks();
  plan->chunk_layout = ChunkLayoutOf(par->schedule());
  plan->virtual_stage_begin.push_back(0);
  for (int n : sizes) {
    plan->virtual_stage_begin.push_back(plan->virtual_stage_begin.back() + n);
  }
  AddParams(plan);
  CheckPatternsMatch(*plan, p);
}

bool GlobMatch(const std::string& pattern, const std::string& name) {
  // Iterative wildcard match with backtracking to the last '*'.
  size_t p = 0, n = 0, star = std::string::npos, mark = 0;
  while (n < name.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = n;
    } else if (p < pattern.size() && pattern[p] == name[n]) {
      ++p;
      ++n;
    } else if (star != std::string::npos) {
      p = star + 1;
      n = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

std::vector<int> BalancedSplit(const std::vector<int64_t>& block_params,
                               int stages) {
  const int n = static_cast<int>(block_params.size());
  CHECK_GE(stages, 1);
  CHECK_LE(stages, n);
  std::vector<int64_t> prefix(n + 1, 0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + block_params[i];
  auto sum = [&](int a, int b) { return prefix[b] - prefix[a]; };

  // min_parts(bound)[j]: fewest contiguous parts with sums <= bound covering
  // blocks [j, n); greedy packing is optimal, and every bound tried is at
  // least the largest block, so a covering always exists.
  auto min_parts = [&](int64_t bound) {
    std::vector<int> f(n + 1, 0);
    int next = n;
    for (int j = n - 1; j >= 0; --j) {
      // Furthest end e with sum(j, e) <= bound; moves left as j does.
      while (sum(j, next) > bound) --next;
      f[j] = 1 + f[next];
    }
    return f;
  };

  int64_t lo = *std::max_element(block_params.begin(), block_params.end());
  int64_t hi = prefix[n];
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (min_parts(mid)[0] <= stages) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  const int64_t bound = lo;
  const std::vector<int> f = min_parts(bound);

  // Lexicographically smallest sizes: each stage takes the fewest blocks
  // that still leave a feasible split of the rest into the stages left.
  std::vector<int> sizes;
  int j = 0;
  for (int s = 0; s < stages; ++s) {
    const int left = stages - s - 1;
    if (left == 0) {
      sizes.push_back(n - j);
      break;
    }
    int k = 1;
    while (
        !(sum(j, j + k) <= bound && f[j + k] <= left && n - (j + k) >= left)) {
      ++k;
      CHECK_LE(j + k, n) << "BalancedSplit: no feasible split (bug)";
    }
    sizes.push_back(k);
    j += k;
  }
  return sizes;
}

}  // namespace trainyard
