// MlpBlock: one block of the Trainyard MLP on the CPU, after Megatron Core's
// MLP. Its configuration is core/block_config.h's MlpBlockConfig:
//
//   y = fc2(act(fc1(norm(x)))) (+ x if residual)
//
// fc1 maps in -> ffn (2*ffn for SwiGLU, whose first half goes through SiLU
// and multiplies the second half), fc2 maps ffn -> out. Weights use
// PyTorch's nn.Linear layout [out_features, in_features].
//
// Backward is split like Megatron's backward_dw(): BackwardInput computes the
// input gradient and stashes what the weight gradient needs;
// BackwardWeight later accumulates the weight gradients. Pipeline schedules
// may run the two at different times (zero-bubble), in any order across
// microbatches as long as each microbatch's BackwardWeight follows its own
// BackwardInput.
//
// An MlpBlock holds no parameters; it reads the caller's tensors, so one
// stage can keep all its parameters in one flat buffer. Not thread-safe per
// call site; distinct blocks may run on distinct threads.
#ifndef TRAINYARD_KERNELS_MLP_BLOCK_H_
#define TRAINYARD_KERNELS_MLP_BLOCK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/block_config.h"
#include "core/tensor.h"
#include "kernels/packed_gemm.h"

namespace trainyard {

struct MlpBlockPacked;

// Parameters (or their gradients), in BlockParamInfos order; tensors that
// the config does not use stay undefined.
struct MlpBlockParams {
  Tensor norm_weight;  // [in]
  Tensor norm_bias;    // [in] (LayerNorm only)
  Tensor fc1_weight;   // [fc1_out, in]
  Tensor fc1_bias;     // [fc1_out]
  Tensor fc2_weight;   // [out, ffn]
  Tensor fc2_bias;     // [out]
  // Optional, GPU only: bfloat16 copies of fc1_weight and fc2_weight (the
  // float32 weights rounded), written by the optimizer with each update.
  // bf16 blocks read them instead of casting the weights on every call.
  // Not parameters: InOrder does not list them.
  Tensor fc1_weight_bf16;  // [fc1_out, in]
  Tensor fc2_weight_bf16;  // [out, ffn]
  // Optional, CPU, not owned: where a block using the packed GEMM
  // (PackedGemmEnabled()) keeps fc1_weight and fc2_weight packed from a
  // forward GEMM to the later GEMMs that read them (later microbatches, and
  // the input gradients; each pack is made by the first forward GEMM). The
  // caller Resets it after every change of the weights; a stale pack gives
  // wrong results. Without it, each GEMM packs as it goes. The same bits
  // either way.
  MlpBlockPacked* packed = nullptr;

  // Pointers to the tensors above in BlockParamInfos order.
  std::vector<Tensor*> InOrder(const MlpBlockConfig& config);
};

// What Forward saves for the backward passes of one microbatch.
struct MlpBlockSaved {
  Tensor x;         // [b, in]  block input
  Tensor norm_out;  // [b, in]  (alias of x when norm is none)
  Tensor mean;      // [b]      LayerNorm only
  Tensor rstd;      // [b]      LayerNorm/RMSNorm
  Tensor fc1_out;   // [b, fc1_out] pre-activation
  Tensor act_out;   // [b, ffn]
  // Filled by BackwardInput for BackwardWeight (BackwardInput releases
  // fc1_out, which the weight gradients do not read):
  Tensor d_out;       // [b, out]  gradient of the block output
  Tensor d_fc1_out;   // [b, fc1_out]
  Tensor d_norm_out;  // [b, in]   (norm weight/bias gradients)
};

// fc1's and fc2's weights in the layout of kernels/packed_gemm.h, one pack
// each: the forward's op(B) = W^T, which the input gradient reads too
// (SgemmPackedTransposed). As much memory as the weights.
struct MlpBlockPacked {
  struct Weight {
    PackedMatrix matrix;
    bool ready = false;  // holds the current weights
  };
  Weight fc1;  // fc1.weight^T [in, fc1_out]
  Weight fc2;  // fc2.weight^T [ffn, out]

  // The weights changed: each pack is made again by the next forward GEMM
  // (the buffers stay allocated).
  void Reset() {
    fc1.ready = false;
    fc2.ready = false;
  }
};

// One of the block's weight GEMMs: out [b, n] = x [b, k] @ op(W), with W a
// [n, k] weight read transposed (forward: op(W) = W^T) or a [k, n] one read
// as is (input gradient), then `epilogue` on each block of out. On the
// packed GEMM when UsePackedGemm(b): `slot` (may be null) holds W^T, the
// forward's pack. The forward reads it when it is ready, else packs W as it
// goes (into `slot`, then ready); the input gradient reads it when it is
// ready, else packs W into a small buffer as it goes. Else on OpenBLAS.
// `name` names the weight in errors: FailedPrecondition for a ready pack of
// another shape.
absl::Status MlpWeightGemm(const char* name, bool transposed, int64_t b,
                           int64_t n, int64_t k, const float* x, const float* w,
                           MlpBlockPacked::Weight* slot, float* out,
                           const GemmEpilogue& epilogue = {});

// Tests: how many weight GEMMs in this process read a pack made by an
// earlier GEMM (MlpWeightGemm with a ready slot).
int64_t KeptPackReadsForTesting();

class MlpBlock {
 public:
  explicit MlpBlock(const MlpBlockConfig& config) : config_(config) {}
  const MlpBlockConfig& config() const { return config_; }

  // y [b, out] = block(x [b, in]). Allocates y and the saved tensors.
  absl::Status Forward(const MlpBlockParams& params, const Tensor& x, Tensor* y,
                       MlpBlockSaved* saved) const;

  // dx [b, in] from d_out [b, out]; stores into *saved what BackwardWeight
  // needs. `dx` may be null for the first block of the model.
  absl::Status BackwardInput(const MlpBlockParams& params, const Tensor& d_out,
                             MlpBlockSaved* saved, Tensor* dx) const;

  // grads += dL/dparams for the microbatch in `saved`. With accumulate =
  // false the gradients are overwritten instead (first microbatch of a step;
  // saves zeroing the buffers). Releases the saved tensors. The weight
  // gradients run on the packed GEMM (SgemmWeightGradient) when
  // UsePackedGemm(rows), else on OpenBLAS.
  absl::Status BackwardWeight(MlpBlockSaved* saved, bool accumulate,
                              MlpBlockParams* grads) const;

  // BackwardWeight for several microbatches in order, the first with
  // `accumulate`, the others accumulating: the same bits as one call each.
  // Consecutive microbatches on the packed GEMM are chained: each weight
  // gradient is one SgemmWeightGradient over them, which reads and writes
  // the gradient once instead of once a microbatch. Releases every saved.
  absl::Status BackwardWeights(absl::Span<MlpBlockSaved* const> saved,
                               bool accumulate, MlpBlockParams* grads) const;

 private:
  MlpBlockConfig config_;
};

}  // namespace trainyard

#endif  // TRAINYARD_KERNELS_MLP_BLOCK_H_
