#include "kernels/block_kernel.h"

#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/bfloat16.h"
#include "core/sim_device.h"
#include "core/status_macros.h"
#include "kernels/cuda/cuda_mlp_block.h"
#include "kernels/packed_gemm.h"

namespace trainyard {

absl::Status BlockKernel::BackwardWeights(absl::Span<BlockSaved* const> saved,
                                          bool accumulate,
                                          MlpBlockParams* grads) {
  for (size_t i = 0; i < saved.size(); ++i) {
    RETURN_IF_ERROR(BackwardWeight(saved[i], accumulate || i > 0, grads));
  }
  return absl::OkStatus();
}

namespace {

// The MlpBlockSaved of each of a CPU kernel's BlockSaved (`Saved`, whose
// member s is one).
template <typename Saved>
std::vector<MlpBlockSaved*> Unwrapped(absl::Span<BlockSaved* const> saved) {
  std::vector<MlpBlockSaved*> out;
  out.reserve(saved.size());
  for (BlockSaved* s : saved) out.push_back(&static_cast<Saved*>(s)->s);
  return out;
}

// An activation a block takes: [rows, width] in the context's activation
// dtype on its device.
absl::Status CheckActivation(const ExecContext& ctx, const char* what,
                             const Tensor& t, int64_t width) {
  if (t.ndim() != 2 || t.dim(1) != width ||
      t.dtype() != ctx.activation_dtype() || t.device() != ctx.device()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is ", DTypeName(t.dtype()),
                     ShapeToString(t.shape()), " on ", t.device().ToString(),
                     ", the block takes ", DTypeName(ctx.activation_dtype()),
                     "[rows, ", width, "] on ", ctx.device().ToString()));
  }
  return absl::OkStatus();
}

// `p`'s six parameter tensors (or gradients) through f into the fields of
// the same names of an `Out`: host views, device pointers.
template <typename Out, typename Params, typename F>
Out MapParams(Params& p, F f) {
  Out out;
  out.norm_weight = f(p.norm_weight);
  out.norm_bias = f(p.norm_bias);
  out.fc1_weight = f(p.fc1_weight);
  out.fc1_bias = f(p.fc1_bias);
  out.fc2_weight = f(p.fc2_weight);
  out.fc2_bias = f(p.fc2_bias);
  return out;
}

// Where a CPU block keeps its weights packed for the packed GEMM between
// BeginPasses and EndPasses, when more than one GEMM reads them: the first
// microbatch's forward GEMMs pack them as they go, for the later forwards
// and the input gradients (a single read, one forward pass of one
// microbatch, packs into a small buffer, not writing packs nobody reads;
// the same bits). A first stage's first block keeps fc1's pack at one
// microbatch though its input gradient is skipped: one weight's pack
// written and not read. Nothing when the packed GEMM is off. The buffers
// stay allocated from one run of passes to the next.
std::atomic<bool> keep_packed_weights{true};

class PassWeights {
 public:
  void Begin(int weight_reads) {
    packed_.Reset();
    active_ = PackedGemmEnabled() && weight_reads >= 2 &&
              keep_packed_weights.load(std::memory_order_relaxed);
  }
  void End() {
    packed_.Reset();
    active_ = false;
  }
  // `params` with the packs attached between Begin and End.
  MlpBlockParams With(const MlpBlockParams& params) {
    MlpBlockParams p = params;
    p.packed = active_ ? &packed_ : nullptr;
    return p;
  }

 private:
  MlpBlockPacked packed_;
  bool active_ = false;
};

class CpuBlockKernel final : public BlockKernel {
 public:
  explicit CpuBlockKernel(const MlpBlockConfig& config) : block_(config) {}
  const MlpBlockConfig& config() const override { return block_.config(); }

  struct Saved final : BlockSaved {
    MlpBlockSaved s;
  };

  absl::Status Forward(const MlpBlockParams& params, const Tensor& x, Tensor* y,
                       std::unique_ptr<BlockSaved>* saved) override {
    auto keep = std::make_unique<Saved>();
    RETURN_IF_ERROR(block_.Forward(packed_.With(params), x, y, &keep->s));
    if (saved != nullptr) *saved = std::move(keep);
    return absl::OkStatus();
  }

  absl::Status BackwardInput(const MlpBlockParams& params, const Tensor& d_out,
                             BlockSaved* saved, Tensor* dx) override {
    return block_.BackwardInput(packed_.With(params), d_out,
                                &static_cast<Saved*>(saved)->s, dx);
  }

  void BeginPasses(int weight_reads) override { packed_.Begin(weight_reads); }
  void EndPasses() override { packed_.End(); }

  absl::Status BackwardWeight(BlockSaved* saved, bool accumulate,
                              MlpBlockParams* grads) override {
    return BackwardWeights({&saved, 1}, accumulate, grads);
  }

  absl::Status BackwardWeights(absl::Span<BlockSaved* const> saved,
                               bool accumulate,
                               MlpBlockParams* grads) override {
    return block_.BackwardWeights(Unwrapped<Saved>(saved), accumulate, grads);
  }

 private:
  MlpBlock block_;
  PassWeights packed_;
};

// The simulated device (core/sim_device.h): the CPU block on host views of
// the device's memory. bf16 activations are widened to float32 for it and
// its outputs rounded back (the simulated device computes in float32);
// parameters and gradients are float32 in every precision.
class SimBlockKernel final : public BlockKernel {
 public:
  SimBlockKernel(const ExecContext* ctx, const MlpBlockConfig& config)
      : ctx_(ctx), block_(config) {}
  const MlpBlockConfig& config() const override { return block_.config(); }

  struct Saved final : BlockSaved {
    MlpBlockSaved s;
  };

  absl::Status Forward(const MlpBlockParams& params, const Tensor& x, Tensor* y,
                       std::unique_ptr<BlockSaved>* saved) override {
    RETURN_IF_ERROR(CheckActivation(*ctx_, "x", x, config().in_features));
    auto keep = std::make_unique<Saved>();
    Tensor host_y;
    RETURN_IF_ERROR(block_.Forward(packed_.With(HostParams(params)), Widened(x),
                                   &host_y, &keep->s));
    ASSIGN_OR_RETURN(*y, ToDevice(host_y));
    if (saved != nullptr) *saved = std::move(keep);
    return absl::OkStatus();
  }

  absl::Status BackwardInput(const MlpBlockParams& params, const Tensor& d_out,
                             BlockSaved* saved, Tensor* dx) override {
    RETURN_IF_ERROR(
        CheckActivation(*ctx_, "d_out", d_out, config().out_features));
    Tensor host_dx;
    RETURN_IF_ERROR(block_.BackwardInput(
        packed_.With(HostParams(params)), Widened(d_out),
        &static_cast<Saved*>(saved)->s, dx != nullptr ? &host_dx : nullptr));
    if (dx != nullptr) {
      ASSIGN_OR_RETURN(*dx, ToDevice(host_dx));
    }
    return absl::OkStatus();
  }

  absl::Status BackwardWeight(BlockSaved* saved, bool accumulate,
                              MlpBlockParams* grads) override {
    return BackwardWeights({&saved, 1}, accumulate, grads);
  }

  absl::Status BackwardWeights(absl::Span<BlockSaved* const> saved,
                               bool accumulate,
                               MlpBlockParams* grads) override {
    MlpBlockParams host = HostParams(*grads);
    return block_.BackwardWeights(Unwrapped<Saved>(saved), accumulate, &host);
  }

  void BeginPasses(int weight_reads) override { packed_.Begin(weight_reads); }
  void EndPasses() override { packed_.End(); }

 private:
  static MlpBlockParams HostParams(const MlpBlockParams& p) {
    return MapParams<MlpBlockParams>(p, [](const Tensor& t) {
      return t.defined() ? SimDeviceAccess::HostView(t) : Tensor();
    });
  }
  // A float32 host view (or widened copy) of a device activation.
  Tensor Widened(const Tensor& t) const {
    Tensor view = SimDeviceAccess::HostView(t);
    if (t.dtype() == DType::kFloat32) return view;
    Tensor wide = Tensor::Empty(DType::kFloat32, t.shape());
    const uint16_t* s = view.data<uint16_t>();
    float* d = wide.data<float>();
    for (int64_t i = 0, n = t.numel(); i < n; ++i) d[i] = Bf16ToFloat(s[i]);
    return wide;
  }
  // A float32 host result as a device activation (rounded for bf16).
  absl::StatusOr<Tensor> ToDevice(const Tensor& host) const {
    if (ctx_->activation_dtype() == DType::kFloat32) {
      return SimDeviceAccess::Adopt(host, ctx_->device());
    }
    ASSIGN_OR_RETURN(Tensor out, ctx_->Empty(DType::kBFloat16, host.shape()));
    uint16_t* d = SimDeviceAccess::HostView(out).data<uint16_t>();
    const float* s = host.data<float>();
    for (int64_t i = 0, n = host.numel(); i < n; ++i) d[i] = FloatToBf16(s[i]);
    return out;
  }

  const ExecContext* ctx_;
  MlpBlock block_;
  PassWeights packed_;
};

// gpu::CudaMlpBlock on Tensors. x and d_out are kept in Saved because the
// CUDA block reads them again in BackwardWeight without copying them.
class CudaBlockKernel final : public BlockKernel {
 public:
  CudaBlockKernel(const ExecContext* ctx,
                  std::unique_ptr<gpu::CudaMlpBlock> block)
      : ctx_(ctx), block_(std::move(block)) {}
  const MlpBlockConfig& config() const override { return block_->config(); }

  struct Saved final : BlockSaved {
    gpu::CudaMlpBlockSaved s;
    Tensor x, d_out;
  };

  absl::Status Forward(const MlpBlockParams& params, const Tensor& x, Tensor* y,
                       std::unique_ptr<BlockSaved>* saved) override {
    RETURN_IF_ERROR(CheckActivation(*ctx_, "x", x, config().in_features));
    const int64_t rows = x.dim(0);
    ASSIGN_OR_RETURN(*y, ctx_->Empty(ctx_->activation_dtype(),
                                     {rows, config().out_features}));
    auto keep = std::make_unique<Saved>();
    keep->x = x;
    RETURN_IF_ERROR(block_->Forward(Pointers(params), rows, x.ptr(), y->ptr(),
                                    &keep->s, ctx_->stream()));
    if (saved != nullptr) *saved = std::move(keep);
    return absl::OkStatus();
  }

  absl::Status BackwardInput(const MlpBlockParams& params, const Tensor& d_out,
                             BlockSaved* saved, Tensor* dx) override {
    Saved* s = static_cast<Saved*>(saved);
    RETURN_IF_ERROR(
        CheckActivation(*ctx_, "d_out", d_out, config().out_features));
    if (d_out.dim(0) != s->x.dim(0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "d_out has ", d_out.dim(0), " rows, x had ", s->x.dim(0)));
    }
    s->d_out = d_out;
    void* dx_ptr = nullptr;
    if (dx != nullptr) {
      ASSIGN_OR_RETURN(*dx, ctx_->Empty(ctx_->activation_dtype(),
                                        {d_out.dim(0), config().in_features}));
      dx_ptr = dx->ptr();
    }
    return block_->BackwardInput(Pointers(params), d_out.ptr(), &s->s, dx_ptr,
                                 ctx_->stream());
  }

  absl::Status BackwardWeight(BlockSaved* saved, bool accumulate,
                              MlpBlockParams* grads) override {
    Saved* s = static_cast<Saved*>(saved);
    const gpu::CudaMlpBlockGrads g = MapParams<gpu::CudaMlpBlockGrads>(
        *grads, [](Tensor& t) { return Float(t); });
    RETURN_IF_ERROR(
        block_->BackwardWeight(&s->s, accumulate, g, ctx_->stream()));
    // The saved buffers went back to the allocator; x and d_out may go as
    // well (their last reader is queued on the same stream).
    s->x = Tensor();
    s->d_out = Tensor();
    return absl::OkStatus();
  }

 private:
  static float* Float(Tensor& t) {
    return t.defined() ? static_cast<float*>(t.ptr()) : nullptr;
  }
  static const float* Float(const Tensor& t) {
    return t.defined() ? static_cast<const float*>(t.ptr()) : nullptr;
  }
  static gpu::CudaMlpBlockParams Pointers(const MlpBlockParams& p) {
    gpu::CudaMlpBlockParams c = MapParams<gpu::CudaMlpBlockParams>(
        p, [](const Tensor& t) { return Float(t); });
    if (p.fc1_weight_bf16.defined())
      c.fc1_weight_bf16 = p.fc1_weight_bf16.ptr();
    if (p.fc2_weight_bf16.defined())
      c.fc2_weight_bf16 = p.fc2_weight_bf16.ptr();
    return c;
  }

  const ExecContext* ctx_;
  std::unique_ptr<gpu::CudaMlpBlock> block_;
};

}  // namespace

void KeepPackedWeightsForTesting(bool keep) {
  keep_packed_weights.store(keep, std::memory_order_relaxed);
}

absl::StatusOr<std::unique_ptr<BlockKernel>> CreateBlockKernel(
    const MlpBlockConfig& config, const ExecContext* ctx) {
  if (ctx->device().is_cpu()) {
    return std::unique_ptr<BlockKernel>(new CpuBlockKernel(config));
  }
  if (ctx->device().is_sim()) {
    return std::unique_ptr<BlockKernel>(new SimBlockKernel(ctx, config));
  }
  gpu::ComputeMode mode = gpu::ComputeMode::kFloat32;
  if (ctx->precision() == Precision::kTf32) mode = gpu::ComputeMode::kTf32;
  if (ctx->precision() == Precision::kBf16) mode = gpu::ComputeMode::kBFloat16;
  ASSIGN_OR_RETURN(
      std::unique_ptr<gpu::CudaMlpBlock> block,
      gpu::CudaMlpBlock::Create(config, mode, ctx->device().index));
  return std::unique_ptr<BlockKernel>(
      new CudaBlockKernel(ctx, std::move(block)));
}

}  // namespace trainyard
