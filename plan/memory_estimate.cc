#include "plan/memory_estimate.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/block_config.h"
#include "core/host_info.h"
#include "core/tensor.h"
#include "kernels/packed_gemm_rows.h"
#include "schedule/schedule.h"

namespace trainyard {
namespace {

using trainyard::v1::JobSpec;

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

// Params, grads, optimizer state and the copies of the state kept outside
// the step, for `n_params` parameters.
void EstimateState(const JobSpec& spec, double n_params, MemoryEstimate* m) {
  const bool bf16 = spec.precision() == "bf16";
  // fp32 master weights, plus a bf16 working copy in mixed precision.
  m->params = SaturatingBytes(n_params * (bf16 ? 6 : 4));
  // With a gradient tree (KeepsGradientTree), each stage also holds
  // floor(log2 (M / R)) + 1 gradient-sized partial sums.
  // A forward-only job (kind infer or eval) keeps no gradients, partial
  // sums, optimizer state or copies.
  const bool trains = spec.kind() == "train";
  int tree_buffers = 0;
  if (KeepsGradientTree(spec)) {
    for (int n = MicrobatchesPerReplica(spec); n > 0; n /= 2) ++tree_buffers;
  }
  m->grads = trains ? SaturatingBytes(n_params * 4 * (1 + tree_buffers)) : 0;
  double state_per_param = 0;
  if (!trains) {
    state_per_param = 0;
  } else if (spec.optimizer().type() == "adamw") {
    state_per_param = 2;
  } else if (spec.optimizer().momentum() > 0) {
    state_per_param = 1;
  }
  m->optimizer_state = SaturatingBytes(n_params * state_per_param * 4);
  const double copies = (spec.checkpoint().dir().empty() ? 0 : 1) +
                        (spec.recovery().snapshot_every() > 0 ? 4 : 0);
  m->state_copies =
      SaturatingBytes(copies * n_params * (4 + state_per_param * 4));
}

// Activation elements per sample of stage `stage`: what its largest chunk
// saves for the backward, and the largest transient backward buffers of
// one block.
struct StageActivations {
  double fwd_max = 0;
  double bwd_max = 0;
};

StageActivations ActivationsOfStage(const JobPlan& plan, int stage) {
  StageActivations a;
  for (int c = 0; c < plan.num_chunks; ++c) {
    double fwd = 0;
    const auto [first, end] = plan.ChunkBlocks(stage, c);
    for (int k = first; k < end; ++k) {
      const MlpBlockConfig& cfg = plan.blocks[k];
      const bool norm = cfg.norm != NormType::kNone;
      fwd += static_cast<double>(cfg.in_features + cfg.fc1_out() +
                                 cfg.ffn_hidden_size + cfg.out_features +
                                 (norm ? cfg.in_features + 2 : 0));
      a.bwd_max = std::max(
          a.bwd_max, static_cast<double>(cfg.out_features + cfg.fc1_out() +
                                         cfg.ffn_hidden_size + cfg.in_features +
                                         (norm ? cfg.in_features : 0)));
    }
    a.fwd_max = std::max(a.fwd_max, fwd);
  }
  return a;
}

// Activation bytes over all stages, at the largest microbatch.
double ActivationBytes(const JobPlan& plan) {
  const JobSpec& spec = plan.spec;
  const int S = plan.num_stages();
  // Each replica runs its own M / R microbatches through the schedule.
  const int per_replica = MicrobatchesPerReplica(spec);
  const double b = static_cast<double>(LargestMicrobatch(spec));
  const double act_elem = spec.precision() == "bf16" ? 2 : 4;
  double act = 0;
  for (int s = 0; s < S; ++s) {
    // (Microbatch, chunk) pairs whose saved tensors a stage holds at once
    // (forward to weight pass; schedule/schedule.h, PeakChunkActivations),
    // each counted at the stage's largest chunk.
    const int in_flight =
        ChainsWeightPasses(plan)
            ? per_replica
            : PeakChunkActivations(spec.parallelism().schedule(), S,
                                   per_replica, plan.num_chunks, s);
    const StageActivations a = ActivationsOfStage(plan, s);
    act += b * (in_flight * a.fwd_max + a.bwd_max) * act_elem;
  }
  return act;
}

// The packs of fc1's and fc2's weights a CPU stage (or a simulated
// device's, whose blocks are the CPU's on host memory) keeps for
// microbatches of at most kPackedGemmMaxRows rows (the most any CPU runs on
// the packed GEMM): each weight [rows, cols] once, as op(B) = W^T [cols, rows]
// in 16-column panels, made by the first forward and read by the later ones and
// by the input gradients (a training step's every microbatch reads each weight
// twice; eval and inference runs read them over all their batches).
double PackedWeightBytes(const JobPlan& plan) {
  const JobSpec& spec = plan.spec;
  if (spec.device() == "cuda" || LargestMicrobatch(spec) > kPackedGemmMaxRows) {
    return 0;
  }
  const auto pad = [](double n) { return std::ceil(n / 16) * 16; };
  const auto packs = [&](double rows, double cols) {
    return 4 * cols * pad(rows);
  };
  double bytes = 0;
  for (const MlpBlockConfig& c : plan.blocks) {
    bytes += packs(c.fc1_out(), c.in_features) +
             packs(c.out_features, c.ffn_hidden_size);
  }
  return bytes;
}

std::string Describe(const MemoryEstimate& m) {
  return absl::StrCat(
      FormatBytes(m.total), " (params ", FormatBytes(m.params), ", grads ",
      FormatBytes(m.grads), ", optimizer state ",
      FormatBytes(m.optimizer_state),
      m.state_copies > 0 ? absl::StrCat(", checkpoint/snapshot copies ",
                                        FormatBytes(m.state_copies))
                         : "",
      ", activations ", FormatBytes(m.activations),
      m.packed_weights > 0
          ? absl::StrCat(", packed weights ", FormatBytes(m.packed_weights))
          : "",
      ", data ", FormatBytes(m.data), ")");
}

}  // namespace

DataMemory EstimateDataMemory(const JobPlan& plan, const DataInfo& data) {
  DataMemory m;
  m.in_memory = data.train.bytes + data.eval.bytes;
  const JobSpec& spec = plan.spec;
  if (spec.data().train().has_npy_shards() && data.train.known &&
      plan.trains()) {
    const uint64_t replicas =
        static_cast<uint64_t>(std::max(1, spec.parallelism().replicas()));
    const uint64_t rows =
        (static_cast<uint64_t>(std::max<int64_t>(1, spec.data().batch_size())) +
         replicas - 1) /
        replicas;
    const uint64_t target_bytes =
        data.train.class_targets ? 8
                                 : 4 * static_cast<uint64_t>(std::max<int64_t>(
                                           1, data.train.target_width));
    const uint64_t row_bytes =
        4 * static_cast<uint64_t>(data.train.features) + target_bytes;
    m.read_ahead = (kReadAheadBatches + 1) * rows * row_bytes;
    constexpr uint64_t kPage = 4096, kFaultAround = 64 << 10;
    m.mapped = rows * ((row_bytes + kPage - 1) / kPage * kPage + kFaultAround);
  }
  m.total = m.in_memory + m.read_ahead + m.mapped;
  return m;
}

void CheckDataMemory(const JobPlan& plan, const DataMemory& memory,
                     Problems* p) {
  const int64_t mib = plan.spec.data().memory_limit_mib();
  if (mib < 0) {
    p->Add("data.memory_limit_mib",
           absl::StrCat("must be >= 0 (0: ", kDefaultDataMemoryLimitMib,
                        "), got ", mib));
    return;
  }
  const uint64_t limit =
      static_cast<uint64_t>(mib > 0 ? mib : kDefaultDataMemoryLimitMib) << 20;
  if (memory.total <= limit) return;
  p->Add("data.memory_limit_mib",
         absl::StrCat("the job's data needs an estimated ",
                      FormatBytes(memory.total), " (held in memory ",
                      FormatBytes(memory.in_memory), ", read-ahead ",
                      FormatBytes(memory.read_ahead), ", mapped pages ",
                      FormatBytes(memory.mapped), ") but the limit is ",
                      FormatBytes(limit), mib > 0 ? "" : " (the default)",
                      memory.in_memory > memory.read_ahead
                          ? ": raise it, or stream the data from npy_shards"
                          : ": raise it, or make the batch smaller"));
}

int64_t LargestMicrobatch(const JobSpec& spec) {
  const int64_t M = spec.parallelism().microbatches();
  return (spec.data().batch_size() + M - 1) / M;
}

int MicrobatchesPerReplica(const JobSpec& spec) {
  return spec.parallelism().microbatches() /
         std::max(1, spec.parallelism().replicas());
}

bool KeepsGradientTree(const JobSpec& spec) {
  return spec.kind() == "train" &&
         spec.parallelism().accumulation() == "tree" &&
         MicrobatchesPerReplica(spec) >= 2;
}

bool ChainsWeightPasses(const JobPlan& plan) {
  const JobSpec& spec = plan.spec;
  return plan.trains() && spec.device() == "cpu" && plan.num_stages() == 1 &&
         plan.num_chunks == 1 &&
         spec.parallelism().accumulation() == "sequential" &&
         MicrobatchesPerReplica(spec) >= 2 &&
         LargestMicrobatch(spec) <= kPackedGemmMaxRows;
}

MemoryEstimate EstimateMemory(const JobPlan& plan, uint64_t data_bytes) {
  double n_params = 0;
  for (const JobPlan::ParamSpec& ps : plan.params) {
    n_params += static_cast<double>(NumElements(ps.shape));
  }
  MemoryEstimate m;
  EstimateState(plan.spec, n_params, &m);
  m.activations = SaturatingBytes(ActivationBytes(plan));
  m.packed_weights = SaturatingBytes(PackedWeightBytes(plan));
  m.data = data_bytes;
  const double total = static_cast<double>(m.params) + m.grads +
                       m.optimizer_state + m.state_copies + m.activations +
                       m.packed_weights + m.data;
  m.total = SaturatingBytes(total);
  m.description = Describe(m);
  return m;
}

absl::Status CheckMemoryLimit(const MemoryEstimate& estimate,
                              const PlanOptions& options) {
  const bool from_machine = options.memory_limit_bytes == 0;
  const uint64_t limit =
      from_machine ? PhysicalMemoryBytes() : options.memory_limit_bytes;
  if (limit > 0 && estimate.total > limit) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "job needs an estimated ", estimate.description, " but ",
        from_machine ? "this machine has " : "the memory limit is ",
        FormatBytes(limit)));
  }
  return absl::OkStatus();
}

}  // namespace trainyard
