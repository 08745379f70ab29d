#include "engine/param_store.h"

#include <cmath>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/random.h"
#include "core/safetensors.h"
#include "core/status_macros.h"

namespace trainyard {

absl::StatusOr<ParamStore> ParamStore::Create(const JobPlan& plan, int stage,
                                              const ExecContext* ctx) {
  ParamStore store;
  store.ctx_ = ctx;
  int64_t total = 0;
  for (size_t p = 0; p < plan.params.size(); ++p) {
    const auto& ps = plan.params[p];
    if (ps.stage != stage) continue;
    ParamSegment seg;
    seg.name = ps.name;
    seg.shape = ps.shape;
    seg.offset = total;
    seg.decay = ps.decay;
    total += seg.size();
    store.segments_.push_back(seg);
    store.global_index_.push_back(static_cast<int>(p));
  }
  ASSIGN_OR_RETURN(store.params_, ctx->Zeros(DType::kFloat32, {total}));
  // A forward-only job (infer, eval) has no gradients.
  if (plan.trains()) {
    ASSIGN_OR_RETURN(store.grads_, ctx->Zeros(DType::kFloat32, {total}));
  }
  const bool bf16_copy =
      ctx->device().is_cuda() && ctx->precision() == Precision::kBf16;
  if (bf16_copy) {
    ASSIGN_OR_RETURN(store.params_bf16_, ctx->Zeros(DType::kBFloat16, {total}));
  }
  // The stage's blocks chunk by chunk: ascending global order, as
  // plan.params lists them (a stage's chunks hold ascending virtual stages).
  std::vector<int> blocks;
  for (int c = 0; c < plan.num_chunks; ++c) {
    const auto [first, end] = plan.ChunkBlocks(stage, c);
    for (int b = first; b < end; ++b) blocks.push_back(b);
  }
  size_t seg = 0;
  for (int b : blocks) {
    store.block_configs_.push_back(plan.blocks[b]);
    store.block_first_segment_.push_back(seg);
    MlpBlockParams params, grads;
    std::vector<Tensor*> p_slots = params.InOrder(plan.blocks[b]);
    std::vector<Tensor*> g_slots = grads.InOrder(plan.blocks[b]);
    for (size_t i = 0; i < p_slots.size(); ++i, ++seg) {
      if (seg >= store.segments_.size()) break;
      const ParamSegment& s = store.segments_[seg];
      *p_slots[i] = s.Of(store.params_);
      if (store.grads_.defined()) *g_slots[i] = s.Of(store.grads_);
      if (bf16_copy && (p_slots[i] == &params.fc1_weight ||
                        p_slots[i] == &params.fc2_weight)) {
        Tensor low = s.Of(store.params_bf16_);
        (p_slots[i] == &params.fc1_weight ? params.fc1_weight_bf16
                                          : params.fc2_weight_bf16) = low;
      }
    }
    store.block_params_.push_back(params);
    store.block_grads_.push_back(grads);
  }
  if (seg != store.segments_.size()) {
    return absl::InternalError(absl::StrCat("stage ", stage, ": plan has ",
                                            store.segments_.size(),
                                            " parameters, blocks use ", seg));
  }
  return store;
}

MlpBlockParams ParamStore::BlockViewsOf(int b, const Tensor& flat,
                                        int64_t base) const {
  MlpBlockParams views;
  std::vector<Tensor*> slots = views.InOrder(block_configs_[b]);
  for (size_t i = 0; i < slots.size(); ++i) {
    ParamSegment s = segments_[block_first_segment_[b] + i];
    s.offset -= base;
    *slots[i] = s.Of(flat);
  }
  return views;
}

NamedTensors ParamStore::Slice(const Tensor& flat) const {
  NamedTensors out;
  for (const ParamSegment& s : segments_) out.push_back({s.name, s.Of(flat)});
  return out;
}

NamedTensors ParamStore::Named() const { return Slice(params_); }

absl::StatusOr<NamedTensors> ParamStore::NamedOnHost() const {
  ASSIGN_OR_RETURN(Tensor host, ctx_->ToHost(params_));
  return Slice(host);
}

absl::Status ParamStore::Load(const std::map<std::string, Tensor>& tensors,
                              const std::string& where) {
  for (auto& [name, dst] : Named()) {
    auto it = tensors.find(name);
    if (it == tensors.end()) {
      return absl::NotFoundError(
          absl::StrCat(where, ": tensor ", name, " is missing"));
    }
    const Tensor& src = it->second;
    if (src.dtype() != DType::kFloat32 || src.shape() != dst.shape()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": tensor ", name, " is ", DTypeName(src.dtype()),
                       ShapeToString(src.shape()), ", the model needs float32",
                       ShapeToString(dst.shape())));
    }
    Tensor alias = dst;
    RETURN_IF_ERROR(ctx_->CopyInto(src, &alias));
  }
  return RefreshLowPrecisionCopy();
}

absl::Status ParamStore::RefreshLowPrecisionCopy() {
  if (!params_bf16_.defined()) return absl::OkStatus();
  return ctx_->CastInto(params_, &params_bf16_);
}

absl::Status ParamStore::Init(const JobPlan& plan) {
  const auto& init = plan.spec.model().init();
  if (!init.safetensors().empty()) {
    ASSIGN_OR_RETURN(SafetensorsFile file, ReadSafetensors(init.safetensors()));
    std::map<std::string, Tensor> by_name(file.tensors.begin(),
                                          file.tensors.end());
    return Load(by_name,
                absl::StrCat("model.init.safetensors: ", init.safetensors()));
  }
  // Seeded init on the host, then one copy to the device.
  Tensor host = params_;
  if (!ctx_->device().is_cpu()) {
    ASSIGN_OR_RETURN(host, Tensor::Create(DType::kFloat32, {total()}));
  }
  for (size_t i = 0; i < segments_.size(); ++i) {
    const ParamSegment& seg = segments_[i];
    const int global = global_index_[i];
    const auto& ps = plan.params[global];
    float* p = host.data<float>() + seg.offset;
    const int64_t n = seg.size();
    if (absl::StrContains(ps.name, ".norm.")) {
      const float v = absl::EndsWith(ps.name, ".weight") ? 1.0f : 0.0f;
      for (int64_t k = 0; k < n; ++k) p[k] = v;
      continue;
    }
    // nn.Linear: weight and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
    const MlpBlockConfig& cfg = plan.blocks[ps.block];
    const bool fc1 = absl::StrContains(ps.name, ".fc1.");
    const int64_t fan_in = fc1 ? cfg.in_features : cfg.ffn_hidden_size;
    const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
    Rng rng(plan.spec.model().init().seed(), static_cast<uint64_t>(global));
    for (int64_t k = 0; k < n; ++k) p[k] = rng.Uniform(-bound, bound);
  }
  if (!ctx_->device().is_cpu()) RETURN_IF_ERROR(ctx_->CopyInto(host, &params_));
  return RefreshLowPrecisionCopy();
}

}  // namespace trainyard
