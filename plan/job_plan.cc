#include "plan/job_plan.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/file_util.h"
#include "core/host_info.h"
#include "core/npy.h"
#include "glog/logging.h"
#include "plan/problems.h"
#include "plan/spec_limits.h"
#include "plan/spec_paths.h"

namespace trainyard {
namespace {

using trainyard::v1::DataSource;
using trainyard::v1::JobSpec;

// What validation learned about one data source.
struct SourceInfo {
  bool known = false;    // rows/features/targets below are valid
  int64_t rows = 0;      // N
  int64_t features = 0;  // D
  bool class_targets = false;
  int64_t target_width = 0;  // K for float targets; #classes if known, else 0
  uint64_t bytes = 0;        // features + targets as held in memory
};

std::string DescribeArray(const NpyHeader& h) {
  return absl::StrCat(DTypeName(h.dtype), " ", ShapeToString(h.shape));
}

void CheckNpySource(const std::string& path, trainyard::v1::NpySource* npy,
                    const PlanOptions& options, Problems* p, SourceInfo* info) {
  bool ok = true;
  if (npy->features().empty()) {
    p->Add(path + ".features", "required");
    ok = false;
  }
  if (npy->targets().empty()) {
    p->Add(path + ".targets", "required");
    ok = false;
  }
  if (!ok) return;
  const std::string features_written = npy->features();
  const std::string targets_written = npy->targets();
  npy->set_features(ResolvePath(options.base_dir, features_written));
  npy->set_targets(ResolvePath(options.base_dir, targets_written));
  const size_t problems = p->size();
  CheckConfined(p, path + ".features", features_written, npy->features(),
                options);
  CheckConfined(p, path + ".targets", targets_written, npy->targets(), options);
  if (p->size() > problems) return;  // never opened
  if (!options.check_files) return;

  auto header = [&](const std::string& field, const std::string& written,
                    const std::string& abs) -> absl::StatusOr<NpyHeader> {
    std::string problem = FileProblem(written, abs);
    if (!problem.empty()) {
      p->Add(path + "." + field, problem);
      return absl::NotFoundError(problem);
    }
    absl::StatusOr<NpyHeader> h = ReadNpyHeader(abs);
    if (!h.ok()) p->Add(path + "." + field, std::string(h.status().message()));
    return h;
  };
  absl::StatusOr<NpyHeader> fh =
      header("features", features_written, npy->features());
  absl::StatusOr<NpyHeader> th =
      header("targets", targets_written, npy->targets());
  if (fh.ok()) {
    if (fh->dtype != DType::kFloat32 || fh->shape.size() != 2) {
      p->Add(path + ".features",
             absl::StrCat(features_written, ": must be float32 [N, D], got ",
                          DescribeArray(*fh)));
      ok = false;
    } else if (fh->shape[0] < 1 || fh->shape[1] < 1) {
      p->Add(path + ".features",
             absl::StrCat(features_written, ": must have N >= 1 rows and ",
                          "D >= 1 columns, got ", ShapeToString(fh->shape)));
      ok = false;
    }
  }
  bool class_targets = false;
  if (th.ok()) {
    const bool ints = th->dtype == DType::kInt32 || th->dtype == DType::kInt64;
    if (ints && th->shape.size() == 1) {
      class_targets = true;
    } else if (th->dtype == DType::kFloat32 && th->shape.size() == 2 &&
               th->shape[1] >= 1) {
      class_targets = false;
    } else {
      p->Add(path + ".targets",
             absl::StrCat(targets_written,
                          ": must be int32/int64 [N] (class ids) or float32 "
                          "[N, K] (K >= 1), got ",
                          DescribeArray(*th)));
      ok = false;
    }
  }
  if (!fh.ok() || !th.ok() || !ok) return;
  if (th->shape[0] != fh->shape[0]) {
    p->Add(path + ".targets",
           absl::StrCat(targets_written, ": has ", th->shape[0],
                        " rows but features have ", fh->shape[0]));
    return;
  }
  info->known = true;
  info->rows = fh->shape[0];
  info->features = fh->shape[1];
  info->class_targets = class_targets;
  info->target_width = class_targets ? 0 : th->shape[1];
  info->bytes =
      static_cast<uint64_t>(NumElements(fh->shape)) * 4 +
      static_cast<uint64_t>(NumElements(th->shape)) * DTypeSize(th->dtype);
}

void CheckSyntheticSource(const std::string& path,
                          trainyard::v1::SyntheticSource* syn,
                          uint64_t data_seed, Problems* p, SourceInfo* info) {
  bool ok = CheckOneOf(p, path + ".kind", syn->kind(),
                       {"teacher_regression", "gaussian_blobs"});
  if (syn->num_samples() < 1) {
    p->Add(path + ".num_samples",
           absl::StrCat("must be > 0, got ", syn->num_samples()));
    ok = false;
  } else if (syn->num_samples() > (int64_t{1} << 36)) {
    p->Add(path + ".num_samples",
           absl::StrCat("must be <= 2^36, got ", syn->num_samples()));
    ok = false;
  }
  if (syn->num_features() < 1 || syn->num_features() > kMaxWidth) {
    p->Add(path + ".num_features",
           absl::StrCat("must be in [1, ", kMaxWidth, "], got ",
                        syn->num_features()));
    ok = false;
  }
  const bool blobs = syn->kind() == "gaussian_blobs";
  const int64_t min_outputs = blobs ? 2 : 1;
  if (syn->num_outputs() < min_outputs || syn->num_outputs() > kMaxWidth) {
    p->Add(path + ".num_outputs",
           absl::StrCat("must be in [", min_outputs, ", ", kMaxWidth, "]",
                        blobs ? " (number of classes)" : "", ", got ",
                        syn->num_outputs()));
    ok = false;
  }
  if (!std::isfinite(syn->noise()) || syn->noise() < 0) {
    p->Add(path + ".noise", absl::StrCat("must be >= 0 and finite, got ",
                                         FormatDouble(syn->noise())));
    ok = false;
  }
  if (ok) {
    // The generator's own limits (engine/dataset.cc): the rows it draws and
    // the per-class centers (gaussian_blobs) or teacher weights must stay
    // below 2^30 values each, so a valid plan never fails to load.
    constexpr double kMaxValues = static_cast<double>(int64_t{1} << 30);
    const double width =
        static_cast<double>(std::max(syn->num_features(), syn->num_outputs()));
    if (static_cast<double>(syn->num_samples()) * width > kMaxValues) {
      p->Add(path + ".num_samples",
             absl::StrCat("num_samples * max(num_features, num_outputs) must "
                          "be <= 2^30, got ",
                          syn->num_samples() * std::max(syn->num_features(),
                                                        syn->num_outputs())));
      ok = false;
    }
    if (static_cast<double>(syn->num_outputs()) * syn->num_features() >
        kMaxValues) {
      p->Add(path + ".num_outputs",
             absl::StrCat("num_outputs * num_features must be <= 2^30, got ",
                          syn->num_outputs() * syn->num_features()));
      ok = false;
    }
  }
  if (syn->seed() == 0) syn->set_seed(data_seed);
  if (!ok) return;
  info->known = true;
  info->rows = syn->num_samples();
  info->features = syn->num_features();
  info->class_targets = blobs;
  info->target_width = syn->num_outputs();
  const uint64_t n = static_cast<uint64_t>(info->rows);
  info->bytes =
      n * static_cast<uint64_t>(info->features) * 4 +
      (blobs ? n * 8 : n * static_cast<uint64_t>(info->target_width) * 4);
}

void CheckSource(const std::string& path, DataSource* source,
                 uint64_t data_seed, const PlanOptions& options, Problems* p,
                 SourceInfo* info) {
  switch (source->source_case()) {
    case DataSource::kNpy:
      CheckNpySource(path + ".npy", source->mutable_npy(), options, p, info);
      break;
    case DataSource::kSynthetic:
      CheckSyntheticSource(path + ".synthetic", source->mutable_synthetic(),
                           data_seed, p, info);
      break;
    default:
      p->Add(path, "needs a source: npy or synthetic");
  }
}

bool ValidName(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) {
      return false;
    }
  }
  return true;
}

// Parameter elements of one block (for the split and the memory estimate).
int64_t BlockParamCount(const MlpBlockConfig& config) {
  int64_t n = 0;
  for (const ParamInfo& info : BlockParamInfos(config)) {
    n += NumElements(info.shape);
  }
  return n;
}

std::string FormatBytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 6) {
    v /= 1024.0;
    ++u;
  }
  if (u == 0) return absl::StrCat(bytes, " B");
  return absl::StrFormat("%.1f %s", v, units[u]);
}

uint64_t SaturatingBytes(double bytes) {
  if (!(bytes < 1.8e19)) return std::numeric_limits<uint64_t>::max();
  return static_cast<uint64_t>(bytes);
}

MemoryEstimate EstimateMemory(const JobPlan& plan, uint64_t data_bytes) {
  const JobSpec& spec = plan.spec;
  const bool bf16 = spec.precision() == "bf16";
  double n_params = 0;
  for (const JobPlan::ParamSpec& ps : plan.params) {
    n_params += static_cast<double>(NumElements(ps.shape));
  }
  MemoryEstimate m;
  // fp32 master weights, plus a bf16 working copy in mixed precision.
  m.params = SaturatingBytes(n_params * (bf16 ? 6 : 4));
  // With accumulation "tree", each stage also holds floor(log2 (M / R)) + 1
  // gradient-sized partial sums (engine/gradient_tree.h).
  int tree_buffers = 0;
  if (spec.parallelism().accumulation() == "tree") {
    const int per_replica = spec.parallelism().microbatches() /
                            std::max(1, spec.parallelism().replicas());
    for (int n = std::max(1, per_replica); n > 0; n /= 2) ++tree_buffers;
  }
  m.grads = SaturatingBytes(n_params * 4 * (1 + tree_buffers));
  double state_per_param = 0;
  if (spec.optimizer().type() == "adamw") {
    state_per_param = 2;
  } else if (spec.optimizer().momentum() > 0) {
    state_per_param = 1;
  }
  m.optimizer_state = SaturatingBytes(n_params * state_per_param * 4);
  const double copies = (spec.checkpoint().dir().empty() ? 0 : 1) +
                        (spec.recovery().snapshot_every() > 0 ? 4 : 0);
  m.state_copies =
      SaturatingBytes(copies * n_params * (4 + state_per_param * 4));

  const int S = plan.num_stages();
  const int v = plan.num_chunks;
  const int M = spec.parallelism().microbatches();
  // Each replica runs its own M / R microbatches through the schedule.
  const int per_replica = M / std::max(1, spec.parallelism().replicas());
  const int64_t B = spec.data().batch_size();
  const double b = static_cast<double>((B + M - 1) / M);  // largest microbatch
  const double act_elem = bf16 ? 2 : 4;
  double act = 0;
  for (int s = 0; s < S; ++s) {
    // (Microbatch, chunk) pairs whose saved tensors a stage holds at once
    // (forward to weight pass; schedule/schedule.h, PeakChunkActivations), each
    // counted at the stage's largest chunk.
    const int in_flight = PeakChunkActivations(spec.parallelism().schedule(), S,
                                               per_replica, v, s);
    double fwd_max = 0;  // saved per microbatch by the largest chunk
    double bwd_max = 0;  // transient backward buffers of one block
    for (int c = 0; c < v; ++c) {
      double fwd = 0;
      const auto [first, end] = plan.ChunkBlocks(s, c);
      for (int k = first; k < end; ++k) {
        const MlpBlockConfig& cfg = plan.blocks[k];
        const bool norm = cfg.norm != NormType::kNone;
        fwd += static_cast<double>(cfg.in_features + cfg.fc1_out() +
                                   cfg.ffn_hidden_size + cfg.out_features +
                                   (norm ? cfg.in_features + 2 : 0));
        bwd_max = std::max(
            bwd_max, static_cast<double>(cfg.out_features + cfg.fc1_out() +
                                         cfg.ffn_hidden_size + cfg.in_features +
                                         (norm ? cfg.in_features : 0)));
      }
      fwd_max = std::max(fwd_max, fwd);
    }
    act += b * (in_flight * fwd_max + bwd_max) * act_elem;
  }
  m.activations = SaturatingBytes(act);
  m.data = data_bytes;
  const double total = static_cast<double>(m.params) + m.grads +
                       m.optimizer_state + m.state_copies + m.activations +
                       m.data;
  m.total = SaturatingBytes(total);
  m.description = absl::StrCat(
      FormatBytes(m.total), " (params ", FormatBytes(m.params), ", grads ",
      FormatBytes(m.grads), ", optimizer state ",
      FormatBytes(m.optimizer_state),
      m.state_copies > 0 ? absl::StrCat(", checkpoint/snapshot copies ",
                                        FormatBytes(m.state_copies))
                         : "",
      ", activations ", FormatBytes(m.activations), ", data ",
      FormatBytes(m.data), ")");
  return m;
}

}  // namespace

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

  // min_parts[j]: fewest contiguous parts with sums <= bound covering
  // blocks [j, n) (greedy packing is optimal); 0 means infeasible is never
  // returned because bound >= the largest block.
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

absl::StatusOr<JobPlan> PlanJob(const JobSpec& spec,
                                const PlanOptions& options) {
  {
    Problems sizes;
    CheckSizeLimits(spec, &sizes);
    if (!sizes.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "job spec over the size limits (", sizes.size(),
          sizes.size() == 1 ? " problem" : " problems", "):\n", sizes.Text()));
    }
  }
  Problems p;
  JobPlan plan;
  JobSpec& s = plan.spec;
  s = spec;

  // ---- Top level.
  if (s.steps() <= 0) {
    p.Add("steps", absl::StrCat("must be > 0, got ", s.steps()));
  }
  if (s.device().empty()) s.set_device("cpu");
  CheckOneOf(&p, "device", s.device(), {"cpu", "cuda", "sim"});
  if (s.precision().empty()) s.set_precision("fp32");
  if (CheckOneOf(&p, "precision", s.precision(), {"fp32", "tf32", "bf16"})) {
    // bf16 runs on GPUs and the simulated device; tf32 only on GPUs.
    const bool ok = s.precision() == "fp32" || s.device() == "cuda" ||
                    (s.precision() == "bf16" && s.device() == "sim");
    if (!ok) {
      p.Add("precision",
            absl::StrCat(s.precision(), " needs device \"cuda\"",
                         s.precision() == "bf16" ? " (or \"sim\")" : "",
                         ", got device ", Quote(s.device()),
                         " (the CPU computes in fp32)"));
    }
  }

  // ---- Data.
  trainyard::v1::DataSpec* data = s.mutable_data();
  if (data->seed() == 0) data->set_seed(s.seed());
  SourceInfo train, eval;
  const size_t problems_before_train = p.size();
  if (!data->has_train()) {
    p.Add("data.train", "required (npy or synthetic)");
  } else {
    CheckSource("data.train", data->mutable_train(), data->seed(), options, &p,
                &train);
  }
  const bool train_reported = p.size() > problems_before_train;
  if (data->has_eval()) {
    CheckSource("data.eval", data->mutable_eval(), data->seed(), options, &p,
                &eval);
    if (train.known && eval.known) {
      const std::string epath =
          data->eval().has_npy() ? "data.eval.npy" : "data.eval.synthetic";
      if (eval.features != train.features) {
        p.Add(epath,
              absl::StrCat("has ", eval.features,
                           " features but data.train has ", train.features));
      }
      if (eval.class_targets != train.class_targets) {
        p.Add(epath,
              absl::StrCat("targets are ",
                           eval.class_targets ? "class ids" : "float values",
                           " but data.train's are ",
                           train.class_targets ? "class ids" : "float values"));
      } else if (!eval.class_targets &&
                 eval.target_width != train.target_width) {
        p.Add(epath,
              absl::StrCat("targets have width ", eval.target_width,
                           " but data.train's have ", train.target_width));
      } else if (eval.class_targets && eval.target_width > 0 &&
                 train.target_width > 0 &&
                 eval.target_width != train.target_width) {
        // Known only for synthetic sources (.npy labels are not read).
        p.Add(epath,
              absl::StrCat("has ", eval.target_width,
                           " classes but data.train has ", train.target_width));
      }
    }
    if (data->eval_fraction() != 0) {
      p.Add("data.eval_fraction",
            absl::StrCat("must be 0 when data.eval is given, got ",
                         FormatDouble(data->eval_fraction())));
    }
  } else {
    const double f = data->eval_fraction();
    if (!(f >= 0 && f < 1)) {
      p.Add("data.eval_fraction",
            absl::StrCat("must be in [0, 1), got ", FormatDouble(f)));
    } else if (f > 0 && train.known) {
      const int64_t held =
          static_cast<int64_t>(std::floor(static_cast<double>(train.rows) * f));
      if (held < 1 || held >= train.rows) {
        p.Add("data.eval_fraction",
              absl::StrCat("holds out ", held, " of data.train's ", train.rows,
                           " rows; need at least 1 eval and 1 train row"));
      }
    }
  }
  const bool has_eval_data = data->has_eval() || data->eval_fraction() > 0;
  if (data->batch_size() <= 0) {
    p.Add("data.batch_size",
          absl::StrCat("must be > 0, got ", data->batch_size()));
  }
  if (data->eval_every() < 0) {
    p.Add("data.eval_every",
          absl::StrCat("must be >= 0, got ", data->eval_every()));
  } else if (data->eval_every() > 0 && !has_eval_data) {
    p.Add("data.eval_every",
          "needs eval data: data.eval or data.eval_fraction > 0");
  }
  plan.feature_dim = train.known ? train.features : 0;
  plan.class_targets = train.class_targets;
  plan.train_rows = train.known ? train.rows : 0;

  // ---- Model.
  trainyard::v1::ModelSpec* model = s.mutable_model();
  const int num_blocks = model->blocks_size();
  bool blocks_ok = true;
  if (num_blocks == 0) {
    p.Add("model.blocks", "must have at least one block");
    blocks_ok = false;
  }
  int64_t prev_out = plan.feature_dim;  // 0 = unknown
  for (int i = 0; i < num_blocks; ++i) {
    trainyard::v1::BlockSpec* b = model->mutable_blocks(i);
    const std::string path = absl::StrCat("model.blocks[", i, "]");
    MlpBlockConfig c;
    bool ok = true;
    auto check_width = [&](const char* field, int64_t v, bool zero_ok) {
      if ((zero_ok ? v < 0 : v <= 0) || v > kMaxWidth) {
        p.Add(absl::StrCat(path, ".", field),
              absl::StrCat(zero_ok ? "must be >= 0" : "must be > 0",
                           v > kMaxWidth ? absl::StrCat(" and <= ", kMaxWidth)
                                         : std::string(),
                           ", got ", v));
        ok = false;
      }
    };
    check_width("out_features", b->out_features(), false);
    check_width("ffn_hidden_size", b->ffn_hidden_size(), false);
    check_width("in_features", b->in_features(), true);
    if (b->in_features() > 0 && prev_out > 0 && b->in_features() != prev_out) {
      p.Add(path + ".in_features",
            absl::StrCat(
                "must match ",
                i == 0 ? "the data's feature count"
                       : absl::StrCat("model.blocks[", i - 1, "].out_features"),
                " (", prev_out, "), got ", b->in_features()));
      ok = false;
    }
    if (b->in_features() == 0 && prev_out > 0) b->set_in_features(prev_out);
    if (b->in_features() == 0) {
      ok = false;
      // Block 0 with unknown data width: say so unless the data's own
      // problem was already reported (later blocks: the previous block's
      // out_features problem was).
      if (i == 0 && !train_reported) {
        p.Add(path + ".in_features",
              "cannot be inferred: the data's feature count is unknown "
              "(files not checked); set it");
      }
    }

    if (b->activation().empty()) b->set_activation("gelu");
    absl::StatusOr<Activation> act = ActivationFromName(b->activation());
    if (act.ok()) {
      c.activation = *act;
    } else {
      p.Add(path + ".activation",
            absl::StrCat("must be one of ",
                         QuotedList({"relu", "gelu", "gelu_tanh", "swiglu"}),
                         ", got ", Quote(b->activation())));
      ok = false;
    }
    if (b->norm().empty()) b->set_norm("none");
    absl::StatusOr<NormType> norm = NormTypeFromName(b->norm());
    if (norm.ok()) {
      c.norm = *norm;
    } else {
      p.Add(path + ".norm",
            absl::StrCat("must be one of ",
                         QuotedList({"none", "layernorm", "rmsnorm"}), ", got ",
                         Quote(b->norm())));
      ok = false;
    }
    if (!b->has_bias()) b->set_bias(true);
    if (b->residual() && b->in_features() > 0 && b->out_features() > 0 &&
        b->in_features() != b->out_features()) {
      p.Add(path + ".residual",
            absl::StrCat("needs in_features == out_features, got ",
                         b->in_features(), " and ", b->out_features()));
      ok = false;
    }
    c.in_features = b->in_features();
    c.out_features = b->out_features();
    c.ffn_hidden_size = b->ffn_hidden_size();
    c.bias = b->bias();
    c.residual = b->residual();
    plan.blocks.push_back(c);
    blocks_ok = blocks_ok && ok;
    prev_out = b->out_features() > 0 ? b->out_features() : 0;
  }
  if (num_blocks > 0 && train.known && train.target_width > 0) {
    const int64_t out = model->blocks(num_blocks - 1).out_features();
    if (out > 0 && out != train.target_width) {
      p.Add(absl::StrCat("model.blocks[", num_blocks - 1, "].out_features"),
            absl::StrCat("must equal ",
                         train.class_targets
                             ? "the number of classes of data.train ("
                             : "the width K of data.train's targets (",
                         train.target_width, "), got ", out));
    }
  }
  if (plan.feature_dim == 0 && num_blocks > 0) {
    plan.feature_dim = model->blocks(0).in_features();  // files not checked
  }
  plan.output_dim =
      num_blocks > 0 ? model->blocks(num_blocks - 1).out_features() : 0;
  trainyard::v1::InitSpec* init = model->mutable_init();
  if (init->seed() == 0) init->set_seed(s.seed());
  if (!init->safetensors().empty()) {
    const std::string written = init->safetensors();
    init->set_safetensors(ResolvePath(options.base_dir, written));
    const size_t problems = p.size();
    CheckConfined(&p, "model.init.safetensors", written, init->safetensors(),
                  options);
    if (options.check_files && p.size() == problems) {
      std::string problem = FileProblem(written, init->safetensors());
      if (!problem.empty()) p.Add("model.init.safetensors", problem);
    }
  }

  // ---- Parallelism.
  trainyard::v1::ParallelismSpec* par = s.mutable_parallelism();
  if (par->stages() == 0) par->set_stages(1);
  if (par->microbatches() == 0) par->set_microbatches(1);
  if (par->schedule().empty()) par->set_schedule("1f1b");
  if (par->chunks() == 0) par->set_chunks(DefaultChunks(par->schedule()));
  if (par->replicas() == 0) par->set_replicas(1);
  if (par->accumulation().empty()) {
    par->set_accumulation(par->replicas() > 1 ? "tree" : "sequential");
  }
  bool stages_ok = true;
  if (par->stages() < 1) {
    p.Add("parallelism.stages",
          absl::StrCat("must be >= 1, got ", par->stages()));
    stages_ok = false;
  } else if (num_blocks > 0 && par->stages() > num_blocks) {
    p.Add("parallelism.stages",
          absl::StrCat("must be <= the number of blocks (", num_blocks,
                       "), got ", par->stages()));
    stages_ok = false;
  }
  const bool schedule_ok =
      CheckOneOf(&p, "parallelism.schedule", par->schedule(),
                 {"gpipe", "1f1b", "zbh1", "interleaved", "zbv"});
  if (schedule_ok) {
    const std::string& name = par->schedule();
    const int v = par->chunks();
    const bool chunks_ok = name == "interleaved" ? v >= 2
                           : name == "zbv"       ? v == 2
                                                 : v == 1;
    if (!chunks_ok) {
      p.Add("parallelism.chunks",
            absl::StrCat("schedule ", Quote(name),
                         name == "interleaved"
                             ? " takes 2 or more chunks per stage"
                         : name == "zbv" ? " takes exactly 2 chunks per stage"
                                         : " takes 1 chunk per stage (only "
                                           "\"interleaved\" and \"zbv\" take "
                                           "more)",
                         ", got ", v));
      stages_ok = false;
    } else if (stages_ok && num_blocks > 0 &&
               int64_t{par->stages()} * v > num_blocks) {
      p.Add("parallelism.chunks",
            absl::StrCat("stages x chunks (", par->stages(), " x ", v,
                         " virtual stages) must be <= the number of blocks (",
                         num_blocks, ")"));
      stages_ok = false;
    }
  } else {
    stages_ok = false;
  }
  if (par->microbatches() < 1) {
    p.Add("parallelism.microbatches",
          absl::StrCat("must be >= 1, got ", par->microbatches()));
  } else if (data->batch_size() > 0 &&
             par->microbatches() > data->batch_size()) {
    p.Add("parallelism.microbatches",
          absl::StrCat("must be <= data.batch_size (", data->batch_size(),
                       "), got ", par->microbatches()));
  }
  CheckOneOf(&p, "parallelism.accumulation", par->accumulation(),
             {"sequential", "tree"});
  if (par->replicas() < 1 || par->replicas() > kMaxReplicas) {
    p.Add("parallelism.replicas", absl::StrCat("must be in [1, ", kMaxReplicas,
                                               "], got ", par->replicas()));
  } else if (par->replicas() > 1) {
    const int r = par->replicas();
    const int m = par->microbatches();
    if (m < r || m % r != 0 || ((m / r) & (m / r - 1)) != 0) {
      p.Add("parallelism.replicas",
            absl::StrCat("parallelism.microbatches / replicas must be a power "
                         "of two (each replica's share one block of the "
                         "summation tree), got ",
                         m, " / ", r));
    }
    if (s.recovery().snapshot_every() > 0) {
      p.Add("recovery.snapshot_every",
            absl::StrCat("must be 0 with replicas > 1 (in-memory snapshots "
                         "follow one pipeline; replicated jobs restart from "
                         "checkpoints), got ",
                         s.recovery().snapshot_every()));
    }
    if (par->accumulation() != "tree") {
      p.Add("parallelism.accumulation",
            absl::StrCat("must be \"tree\" with replicas > 1 (the replicas' "
                         "sums must follow one order), got ",
                         Quote(par->accumulation())));
    }
  }
  if (stages_ok && par->microbatches() >= 1 && par->replicas() >= 1) {
    const int per_replica = par->microbatches() / par->replicas();
    if (par->schedule() == "interleaved" && per_replica % par->stages() != 0) {
      p.Add("parallelism.microbatches",
            absl::StrCat("schedule \"interleaved\" runs microbatches in "
                         "groups of one per stage: microbatches per replica "
                         "must be a multiple of stages (",
                         par->stages(), "), got ", per_replica));
    }
    const int64_t passes = int64_t{par->stages()} * par->chunks() * per_replica;
    if (passes > kMaxScheduledPasses) {
      p.Add("parallelism.microbatches",
            absl::StrCat("stages x chunks x microbatches per replica must be "
                         "<= ",
                         kMaxScheduledPasses,
                         " (the schedule every worker "
                         "builds), got ",
                         passes));
    }
  }
  bool split_ok = true;
  if (par->split_size() > 0) {
    const int64_t virtual_stages = int64_t{par->stages()} * par->chunks();
    if (stages_ok && par->split_size() != virtual_stages) {
      p.Add("parallelism.split",
            par->chunks() == 1
                ? absl::StrCat("must have one entry per stage (", par->stages(),
                               "), got ", par->split_size())
                : absl::StrCat("must have one entry per virtual stage (",
                               par->stages(), " stages x ", par->chunks(),
                               " chunks = ", virtual_stages, "), got ",
                               par->split_size()));
      split_ok = false;
    }
    int64_t total = 0;
    for (int i = 0; i < par->split_size(); ++i) {
      if (par->split(i) < 1) {
        p.Add(absl::StrCat("parallelism.split[", i, "]"),
              absl::StrCat("must be >= 1, got ", par->split(i)));
        split_ok = false;
      }
      total += par->split(i);
    }
    if (split_ok && num_blocks > 0 && total != num_blocks) {
      p.Add("parallelism.split",
            absl::StrCat("must sum to the number of blocks (", num_blocks,
                         "), got ", total));
      split_ok = false;
    }
  }

  // ---- Optimizer.
  trainyard::v1::OptimizerSpec* opt = s.mutable_optimizer();
  if (opt->type().empty()) opt->set_type("adamw");
  const bool type_ok =
      CheckOneOf(&p, "optimizer.type", opt->type(), {"adamw", "sgd"});
  if (!std::isfinite(opt->lr()) || opt->lr() <= 0) {
    p.Add("optimizer.lr", absl::StrCat("must be > 0 and finite, got ",
                                       FormatDouble(opt->lr())));
  }
  auto check_nonneg = [&](const char* field, double v) {
    if (!std::isfinite(v) || v < 0) {
      p.Add(absl::StrCat("optimizer.", field),
            absl::StrCat("must be >= 0 and finite, got ", FormatDouble(v)));
    }
  };
  if (opt->type() == "adamw") {
    if (!opt->has_beta1()) opt->set_beta1(0.9);
    if (!opt->has_beta2()) opt->set_beta2(0.999);
    if (!opt->has_eps()) opt->set_eps(1e-8);
    if (!opt->has_weight_decay()) opt->set_weight_decay(0.01);
    for (auto [field, v] : {std::make_pair("beta1", opt->beta1()),
                            std::make_pair("beta2", opt->beta2())}) {
      if (!(v >= 0 && v < 1)) {
        p.Add(absl::StrCat("optimizer.", field),
              absl::StrCat("must be in [0, 1), got ", FormatDouble(v)));
      }
    }
    if (!std::isfinite(opt->eps()) || opt->eps() <= 0) {
      p.Add("optimizer.eps", absl::StrCat("must be > 0 and finite, got ",
                                          FormatDouble(opt->eps())));
    }
    if (opt->momentum() != 0) p.Add("optimizer.momentum", "only for sgd");
    if (opt->dampening() != 0) p.Add("optimizer.dampening", "only for sgd");
    if (opt->nesterov()) p.Add("optimizer.nesterov", "only for sgd");
  } else if (opt->type() == "sgd") {
    if (opt->has_beta1()) p.Add("optimizer.beta1", "only for adamw");
    if (opt->has_beta2()) p.Add("optimizer.beta2", "only for adamw");
    if (opt->has_eps()) p.Add("optimizer.eps", "only for adamw");
    if (!opt->has_weight_decay()) opt->set_weight_decay(0.0);
    check_nonneg("momentum", opt->momentum());
    if (!(opt->dampening() >= 0 && opt->dampening() <= 1)) {
      p.Add("optimizer.dampening",
            absl::StrCat("must be in [0, 1], got ",
                         FormatDouble(opt->dampening())));
    }
    if (opt->nesterov() && (opt->momentum() <= 0 || opt->dampening() != 0)) {
      p.Add("optimizer.nesterov",
            absl::StrCat("requires momentum > 0 and dampening == 0 (as "
                         "torch.optim.SGD), got momentum ",
                         FormatDouble(opt->momentum()), ", dampening ",
                         FormatDouble(opt->dampening())));
    }
  }
  if (type_ok) check_nonneg("weight_decay", opt->weight_decay());
  check_nonneg("clip_grad", opt->clip_grad());
  if (opt->decay_mask().empty()) opt->set_decay_mask("default");
  CheckOneOf(&p, "optimizer.decay_mask", opt->decay_mask(),
             {"default", "all", "patterns"});
  const bool patterns = opt->decay_mask() == "patterns";
  if (patterns && opt->no_decay_size() == 0) {
    p.Add("optimizer.no_decay",
          "decay_mask \"patterns\" needs at least one pattern");
  } else if (!patterns && opt->no_decay_size() > 0) {
    p.Add("optimizer.no_decay",
          absl::StrCat("only for decay_mask \"patterns\", got decay_mask ",
                       Quote(opt->decay_mask())));
  }
  std::vector<bool> pattern_ok(opt->no_decay_size(), true);
  for (int i = 0; i < opt->no_decay_size(); ++i) {
    const std::string& pat = opt->no_decay(i);
    const bool chars_ok =
        !pat.empty() && std::all_of(pat.begin(), pat.end(), [](char c) {
          return std::isalnum(static_cast<unsigned char>(c)) || c == '_' ||
                 c == '.' || c == '*';
        });
    if (!chars_ok) {
      p.Add(absl::StrCat("optimizer.no_decay[", i, "]"),
            absl::StrCat("must be a non-empty glob of [A-Za-z0-9_.*], got ",
                         Quote(pat)));
      pattern_ok[i] = false;
    }
  }

  trainyard::v1::LrScheduleSpec* sched = opt->mutable_schedule();
  if (sched->type().empty()) sched->set_type("constant");
  CheckOneOf(&p, "optimizer.schedule.type", sched->type(),
             {"constant", "cosine", "linear"});
  if (sched->total_steps() == 0) sched->set_total_steps(s.steps());
  const bool decaying = sched->type() == "cosine" || sched->type() == "linear";
  if (sched->warmup_steps() < 0) {
    p.Add("optimizer.schedule.warmup_steps",
          absl::StrCat("must be >= 0, got ", sched->warmup_steps()));
  } else if (decaying && sched->total_steps() > 0 &&
             sched->warmup_steps() >= sched->total_steps()) {
    p.Add("optimizer.schedule.warmup_steps",
          absl::StrCat("must be < total steps (", sched->total_steps(),
                       ") when decaying, got ", sched->warmup_steps()));
  }
  if (sched->total_steps() < 0) {
    p.Add("optimizer.schedule.total_steps",
          absl::StrCat("must be >= 0, got ", sched->total_steps()));
  }
  if (decaying) {
    if (!(sched->min_lr() >= 0 && sched->min_lr() <= opt->lr())) {
      p.Add("optimizer.schedule.min_lr",
            absl::StrCat("must be in [0, lr] = [0, ", FormatDouble(opt->lr()),
                         "], got ", FormatDouble(sched->min_lr())));
    }
  } else if (sched->min_lr() != 0) {
    p.Add("optimizer.schedule.min_lr",
          absl::StrCat("only for schedule type \"cosine\" or \"linear\", got ",
                       Quote(sched->type())));
  }

  // ---- Task.
  if (!ValidName(s.task().plugin())) {
    p.Add("task.plugin", s.task().plugin().empty()
                             ? std::string("required")
                             : absl::StrCat("must match [A-Za-z0-9_]+, got ",
                                            Quote(s.task().plugin())));
  }

  // ---- Checkpoint.
  trainyard::v1::CheckpointSpec* ckpt = s.mutable_checkpoint();
  if (ckpt->every() < 0) {
    p.Add("checkpoint.every",
          absl::StrCat("must be >= 0, got ", ckpt->every()));
  }
  if (ckpt->keep_last() < 0) {
    p.Add("checkpoint.keep_last",
          absl::StrCat("must be >= 0, got ", ckpt->keep_last()));
  }
  if (ckpt->resume().empty()) ckpt->set_resume("never");
  CheckOneOf(&p, "checkpoint.resume", ckpt->resume(), {"never", "latest"});
  if (ckpt->dir().empty()) {
    if (ckpt->every() > 0) p.Add("checkpoint.every", "needs checkpoint.dir");
    if (ckpt->keep_last() > 0) {
      p.Add("checkpoint.keep_last", "needs checkpoint.dir");
    }
    if (ckpt->resume() == "latest") {
      p.Add("checkpoint.resume", "\"latest\" needs checkpoint.dir");
    }
  } else {
    const std::string written = ckpt->dir();
    ckpt->set_dir(ResolvePath(options.base_dir, written));
    CheckConfined(&p, "checkpoint.dir", written, ckpt->dir(), options);
  }

  // ---- Recovery.
  trainyard::v1::RecoverySpec* rec = s.mutable_recovery();
  if (!rec->has_max_restarts()) rec->set_max_restarts(kDefaultMaxRestarts);
  if (!rec->has_backoff_ms()) rec->set_backoff_ms(kDefaultRestartBackoffMs);
  if (rec->max_restarts() < 0 || rec->max_restarts() > kMaxRestartsLimit) {
    p.Add("recovery.max_restarts",
          absl::StrCat("must be in [0, ", kMaxRestartsLimit, "], got ",
                       rec->max_restarts()));
  }
  if (rec->snapshot_every() < 0) {
    p.Add("recovery.snapshot_every",
          absl::StrCat("must be >= 0, got ", rec->snapshot_every()));
  }
  if (rec->backoff_ms() < 0 || rec->backoff_ms() > kMaxRestartBackoffMs) {
    p.Add("recovery.backoff_ms",
          absl::StrCat("must be in [0, ", kMaxRestartBackoffMs, "], got ",
                       rec->backoff_ms()));
  }

  // ---- Split and parameters (need valid blocks).
  const bool can_place = blocks_ok && stages_ok && split_ok;
  if (can_place) {
    std::vector<int> sizes(par->split().begin(), par->split().end());
    if (sizes.empty()) {
      std::vector<int64_t> counts;
      for (const MlpBlockConfig& c : plan.blocks) {
        counts.push_back(BlockParamCount(c));
      }
      sizes = BalancedSplit(counts, par->stages() * par->chunks());
      for (int n : sizes) par->add_split(n);
    }
    plan.num_chunks = par->chunks();
    plan.chunk_layout = ChunkLayoutOf(par->schedule());
    plan.virtual_stage_begin.push_back(0);
    for (int n : sizes) {
      plan.virtual_stage_begin.push_back(plan.virtual_stage_begin.back() + n);
    }
    std::vector<int> stage_of_block(plan.blocks.size());
    for (int stage = 0; stage < par->stages(); ++stage) {
      for (int c = 0; c < plan.num_chunks; ++c) {
        const auto [first, end] = plan.ChunkBlocks(stage, c);
        for (int k = first; k < end; ++k) stage_of_block[k] = stage;
      }
    }
    for (int k = 0; k < static_cast<int>(plan.blocks.size()); ++k) {
      const int stage = stage_of_block[k];
      {
        for (ParamInfo& info : BlockParamInfos(plan.blocks[k])) {
          JobPlan::ParamSpec ps;
          ps.name = absl::StrCat("blocks.", k, ".", info.name);
          ps.shape = std::move(info.shape);
          ps.block = k;
          ps.stage = stage;
          if (opt->decay_mask() == "all") {
            ps.decay = true;
          } else if (patterns) {
            ps.decay = true;
            for (const std::string& pat : opt->no_decay()) {
              if (GlobMatch(pat, ps.name)) ps.decay = false;
            }
          } else {
            ps.decay = !info.is_bias_or_norm;
          }
          plan.params.push_back(std::move(ps));
        }
      }
    }
    for (int i = 0; i < opt->no_decay_size(); ++i) {
      if (!pattern_ok[i]) continue;
      const bool any =
          std::any_of(plan.params.begin(), plan.params.end(),
                      [&](const JobPlan::ParamSpec& ps) {
                        return GlobMatch(opt->no_decay(i), ps.name);
                      });
      if (!any) {
        p.Add(absl::StrCat("optimizer.no_decay[", i, "]"),
              absl::StrCat("pattern ", Quote(opt->no_decay(i)),
                           " matches no parameter"));
      }
    }
  }

  if (!p.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid job spec", spec.name().empty() ? "" : " " + Quote(spec.name()),
        " (", p.size(), p.size() == 1 ? " problem" : " problems", "):\n",
        p.Text()));
  }

  // ---- Memory.
  plan.memory = EstimateMemory(plan, train.bytes + eval.bytes);
  const bool from_machine = options.memory_limit_bytes == 0;
  const uint64_t limit =
      from_machine ? PhysicalMemoryBytes() : options.memory_limit_bytes;
  if (limit > 0 && plan.memory.total > limit) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "job needs an estimated ", plan.memory.description, " but ",
        from_machine ? "this machine has " : "the memory limit is ",
        FormatBytes(limit)));
  }
  return plan;
}

}  // namespace trainyard
